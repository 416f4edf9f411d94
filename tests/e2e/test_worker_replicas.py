"""One worker process running three mocker workers (``jetfleet worker --replicas 3``): each is a
whole worker on the wire (registration, KV events, load reports, its own request consumer), the
KV router sends requests to each, a cancel reaches the replica holding its request, SIGTERM
drains all three."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from nats.js.errors import NotFoundError

from base.connect import close_nats, connect_nats, connect_redis
from router.kv.keys import namespace
from router.kv.redis_index import RedisPrefixIndex
from schemas import Subjects, WorkerLoad, decode
from tests.e2e.test_fleet_lifecycle import Observations
from tests.support.clients import subscribed
from tests.support.fleet import Fleet
from tests.support.wait import wait_for
from workers.intake import own_consumer

pytestmark = pytest.mark.integration

M = "jetfleet-tiny"


@pytest.fixture(scope="module")
def replicas_fleet(
    nats_server, redis_server, tmp_path_factory
) -> Iterator[tuple[Fleet, str, list[str]]]:
    """An indexer, a kv frontend and one process of three workers (speedup 1: a long request
    lasts long enough to cancel or drain)."""
    f = Fleet(
        nats_server.url,
        tmp_path_factory.mktemp("replicas"),
        redis_url=redis_server.url,
        worker_args=("--speedup", "1"),
    )
    try:
        name, ids = f.add_replicas(3)
        f.start_indexer()
        f.start_frontend("--router", "kv")
        yield f, name, ids
    finally:
        f.stop()


class _LoadReports:
    """The worker ids seen in load reports (each worker reports on its own subject)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.workers: set[str] = set()

    async def __aenter__(self) -> _LoadReports:
        self.nc = await connect_nats(self.fleet.nats_url, name="test-load")

        async def on(msg: Any) -> None:
            load = decode(msg.data, WorkerLoad)
            assert msg.subject == Subjects(self.fleet.prefix).metrics(M, "agg", load.worker_id)
            self.workers.add(load.worker_id)

        await self.nc.subscribe(Subjects(self.fleet.prefix).metrics_all(), cb=on)
        await subscribed(self.nc)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await close_nats(self.nc)


async def test_each_replica_registers_and_serves_what_the_kv_router_sends_it(replicas_fleet):
    fleet, _name, ids = replicas_fleet
    ready = await wait_for(lambda: _ready(fleet, ids), timeout=30)
    assert {ready[w]["pid"] for w in ids} == {ready[ids[0]]["pid"]}  # one process
    redis = await connect_redis(fleet.redis_url)
    index = RedisPrefixIndex(redis, namespace(fleet.prefix))
    prompts = iter(range(1000))
    try:
        async with (
            Observations(fleet) as obs,
            _LoadReports(fleet) as loads,
            httpx.AsyncClient(timeout=30) as client,
        ):

            async def every_replica_served() -> bool:
                # fresh prompts: every replica costs the same, the router breaks ties at random
                prompt = f"replica routing probe number {next(prompts)}, " * 4
                body = {"model": M, "prompt": prompt, "max_tokens": 2}
                r = await client.post(f"{fleet.base_url}/v1/completions", json=body)
                assert r.status_code == 200, r.text
                return {o.worker_id for o in obs.items} >= set(ids)

            await wait_for(every_replica_served, timeout=60, interval=0.01)
            await wait_for(lambda: loads.workers >= set(ids), timeout=10)

            async def indexed() -> bool:  # each replica's KV events reached the index
                return await index.workers(M) >= set(ids)

            await wait_for(indexed, timeout=10)
        for o in obs.items:
            assert o.status == "ok" and o.route is not None and o.route.policy == "kv"
            assert o.route.worker_id == o.worker_id  # served where the router sent it
            assert {c.worker_id for c in o.route.candidates} == set(ids)
    finally:
        await redis.aclose()


async def test_a_cancel_reaches_the_replica_holding_the_request(replicas_fleet):
    fleet, name, ids = replicas_fleet
    await wait_for(lambda: _ready(fleet, ids), timeout=30)
    async with Observations(fleet) as obs, httpx.AsyncClient(timeout=30) as client:
        body = {"model": M, "prompt": "a long answer, please", "max_tokens": 3000, "stream": True}
        async with client.stream("POST", f"{fleet.base_url}/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: ") and '"text"' in line:
                    break  # got the first token: hang up
        started = time.monotonic()
        cancelled = await wait_for(
            lambda: next((o for o in obs.items if o.status == "cancelled"), None), timeout=10
        )

        def cancelled_by() -> set[str]:
            return {
                e["worker_id"]
                for e in _events(fleet.log(name), "request_cancelled")
                if e["request_id"] == cancelled.request_id
            }

        assert await wait_for(cancelled_by, timeout=10) == {cancelled.worker_id}

        async def idle() -> bool:
            row = (await fleet.ready_workers()).get(cancelled.worker_id, {})
            return row.get("num_running") == 0

        await wait_for(idle, timeout=10)
    # 3000 tokens at real mocker speed take ~17 s: aborted, not run to the end
    assert time.monotonic() - started < 12


async def test_sigterm_drains_every_replica_and_deregisters_them(replicas_fleet):
    fleet, name, ids = replicas_fleet
    await wait_for(lambda: _ready(fleet, ids), timeout=30)
    max_tokens = 400  # ~2.5 s at speedup 1: still running when the signal comes
    async with Observations(fleet) as obs, httpx.AsyncClient(timeout=60) as client:

        async def complete(i: int) -> dict[str, Any]:
            prompt = f"drain me, request {i} of a few, " * 4
            body = {"model": M, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
            r = await client.post(f"{fleet.base_url}/v1/completions", json=body)
            assert r.status_code == 200, r.text
            return dict(r.json())

        tasks = [asyncio.create_task(complete(i)) for i in range(6)]

        async def busy() -> bool:
            rows = await fleet.ready_workers()
            return sum(rows.get(w, {}).get("num_running") or 0 for w in ids) >= 3

        await wait_for(busy, timeout=10)
        code = await asyncio.to_thread(fleet.group.stop, name, 30.0)
        results = await asyncio.gather(*tasks)
        await wait_for(lambda: len(obs.items) >= 6, timeout=10)
    assert code == 0
    assert all(r["usage"]["completion_tokens"] == max_tokens for r in results)
    assert all(o.attempts == 1 and o.worker_id in ids for o in obs.items)  # drained, not moved
    drained = {e["worker_id"] for e in _events(fleet.log(name), "worker_drained")}
    assert drained == set(ids)
    assert not set(await fleet.registered_workers()) & set(ids)  # deregistered, not expired
    await _no_own_consumers(fleet, ids)


async def test_replicas_pull_the_pool_only_while_they_have_free_slots(nats_server, tmp_path):
    """One pull loop for the process: each request it fetches goes to a replica with room."""
    f = Fleet(nats_server.url, tmp_path, worker_args=("--speedup", "5", "--max-num-seqs", "2"))
    try:
        name, ids = f.add_replicas(3)
        url = f.start_frontend("--router", "pool")
        await wait_for(lambda: _ready(f, ids), timeout=30)
        async with Observations(f) as obs, httpx.AsyncClient(timeout=60) as client:

            async def complete(i: int) -> None:
                body = {"model": M, "prompt": f"burst {i}", "max_tokens": 200, "ignore_eos": True}
                r = await client.post(f"{url}/v1/completions", json=body)
                assert r.status_code == 200, r.text

            await asyncio.gather(*(complete(i) for i in range(15)))
            await wait_for(lambda: len(obs.items) >= 15, timeout=10)
        assert all(o.status == "ok" and o.attempts == 1 for o in obs.items)
        assert {o.worker_id for o in obs.items} == set(ids)  # every replica pulled
        peaks = _max_concurrent(f.log(name))
        assert max(peaks.values()) == 2, peaks  # busy, and never more than its slots
    finally:
        f.stop()


def _max_concurrent(log: str) -> dict[str, int]:
    """Each replica's most requests in flight at once, from its start/finish log lines."""
    running: dict[str, int] = {}
    peak: dict[str, int] = {}
    for line in log.splitlines():
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        step = {"request_started": 1, "request_finished": -1}.get(entry.get("event", ""), 0)
        if step:
            w = entry["worker_id"]
            running[w] = running.get(w, 0) + step
            peak[w] = max(peak.get(w, 0), running[w])
    return peak


async def _ready(fleet: Fleet, ids: list[str]) -> dict[str, dict[str, Any]]:
    ready = await fleet.ready_workers()
    return ready if set(ids) <= set(ready) else {}


def _events(log: str, event: str) -> list[dict[str, Any]]:
    out = []
    for line in log.splitlines():
        if f'"{event}"' in line:
            entry = json.loads(line)
            if entry.get("event") == event:
                out.append(entry)
    return out


async def _no_own_consumers(fleet: Fleet, ids: list[str]) -> None:
    nc = await connect_nats(fleet.nats_url, name="test-consumers")
    try:
        js = nc.jetstream()
        stream = Subjects(fleet.prefix).stream_name("REQUESTS")
        for worker_id in ids:
            with pytest.raises(NotFoundError):
                await js.consumer_info(stream, own_consumer(worker_id))
    finally:
        await close_nats(nc)
