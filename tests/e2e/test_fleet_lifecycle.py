"""Workers joining, sharing, dying, draining; clients disconnecting; load shedding — all real."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import httpx
import pytest

from base.connect import connect_nats
from infra.command import cli_command
from schemas import RequestObservation, Subjects, TokenChunk, decode
from tests.support.clients import sse_events, subscribed
from tests.support.fleet import Fleet
from tests.support.wait import wait_for
from workers.intake import own_consumer

pytestmark = pytest.mark.integration

M = "jetfleet-tiny"


@pytest.fixture(scope="module")
def slow_fleet(nats_server, tmp_path_factory):
    """Speedup 1 (real mocker timing), so requests last long enough to interfere with."""
    f = Fleet(
        nats_server.url, tmp_path_factory.mktemp("slow-fleet"), worker_args=("--speedup", "1")
    )
    f.add_worker()
    f.add_worker()
    f.start_frontend("--router", "round-robin", "--stall-timeout", "5")
    yield f
    f.stop()


class Observations:
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.items: list[RequestObservation] = []

    async def __aenter__(self) -> Observations:
        self.nc = await connect_nats(self.fleet.nats_url, name="test-obs")

        async def on(msg) -> None:
            self.items.append(decode(msg.data, RequestObservation))

        await self.nc.subscribe(Subjects(self.fleet.prefix).obs_all(), cb=on)
        await subscribed(self.nc)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.nc.close()


async def complete(client: httpx.AsyncClient, fleet: Fleet, max_tokens: int = 4, **kw) -> dict:
    r = await client.post(
        f"{fleet.base_url}/v1/completions",
        json={"model": M, "prompt": "hello", "max_tokens": max_tokens, **kw},
    )
    assert r.status_code == 200, r.text
    return r.json()


async def test_two_workers_share_load(slow_fleet):
    await wait_for(lambda: _count(slow_fleet, 2), timeout=20)
    async with Observations(slow_fleet) as obs, httpx.AsyncClient(timeout=30) as client:
        await asyncio.gather(*(complete(client, slow_fleet) for _ in range(8)))
        await wait_for(lambda: len(obs.items) >= 8, timeout=10)
    used = {o.worker_id for o in obs.items}
    assert len(used) == 2
    assert all(o.route is not None and o.route.policy == "round-robin" for o in obs.items)
    assert all(o.status == "ok" and o.osl_tokens == 4 and o.ttft_s > 0 for o in obs.items)


async def _count(fleet: Fleet, n: int) -> bool:
    return len(await fleet.ready_workers()) == n


async def test_client_disconnect_cancels_generation(slow_fleet):
    async with Observations(slow_fleet) as obs, httpx.AsyncClient(timeout=30) as client:
        body = {"model": M, "prompt": "long", "max_tokens": 3000, "stream": True}
        async with client.stream("POST", f"{slow_fleet.base_url}/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: ") and '"text"' in line:
                    break  # got the first token: hang up
        started = time.monotonic()
        await wait_for(lambda: any(o.status == "cancelled" for o in obs.items), timeout=10)

        async def idle() -> bool:
            return all(
                w.get("num_running") == 0 for w in (await slow_fleet.ready_workers()).values()
            )

        await wait_for(idle, timeout=10)
    # 3000 tokens at real mocker speed would take ~17 s more; a cancel takes a NATS hop, a load
    # report and status lookups (each of them seconds, on a loaded machine)
    assert time.monotonic() - started < 12
    cancelled = [o for o in obs.items if o.status == "cancelled"]
    assert cancelled[0].osl_tokens < 3000


async def test_worker_killed_mid_stream_request_migrates(slow_fleet):
    async with Observations(slow_fleet) as obs, httpx.AsyncClient(timeout=60) as client:
        # 1,200 tokens (~7 s at speedup 1): the serving worker is looked up after the third
        # token, and on a loaded machine that lookup took longer than a 400-token answer (the
        # request had ended when the kill came: attempts 1)
        body = {
            "model": M,
            "prompt": "migrate me",
            "max_tokens": 1200,
            "stream": True,
            "seed": 2,
            "stream_options": {"include_usage": True},
        }
        texts: list[str] = []
        usage = None
        killed = False
        rid = f"migrate-{time.time_ns()}"  # its chunks say which worker serves it
        headers = {"x-request-id": rid}
        url = f"{slow_fleet.base_url}/v1/completions"
        async with client.stream("POST", url, json=body, headers=headers) as r:
            async for event in sse_events(r):
                if event["choices"]:
                    texts.append(event["choices"][0]["text"])
                if event.get("usage"):
                    usage = event["usage"]
                if not killed and len(texts) >= 3:
                    killed = True
                    slow_fleet.kill(await _worker_of(slow_fleet, f"cmpl-{rid}"))
        await wait_for(lambda: len(obs.items) >= 1, timeout=10)
    assert usage is not None and usage["completion_tokens"] == body["max_tokens"]
    assert obs.items[-1].attempts == 2 and obs.items[-1].status == "ok"
    async with httpx.AsyncClient(timeout=60) as client:  # the same seed, undisturbed
        calm = await client.post(
            f"{slow_fleet.base_url}/v1/completions",
            json={**body, "stream": False, "stream_options": None},
        )
    assert "".join(texts) == calm.json()["choices"][0]["text"]  # no token repeated or lost
    slow_fleet.add_worker()  # restore two workers for the next tests
    await wait_for(lambda: _count(slow_fleet, 2), timeout=20)


async def test_a_worker_that_hangs_but_stays_registered_loses_its_stream(nats_server, tmp_path):
    """SIGSTOP: the worker stays in discovery (``--ttl 60``) but sends nothing; only the
    frontend's stall timeout (1 s) can move the stream to the other worker."""
    f = Fleet(nats_server.url, tmp_path, worker_args=("--speedup", "1", "--ttl", "60"))
    stopped: list[int] = []  # SIGSTOPped, to SIGCONT
    try:
        f.add_worker()
        f.add_worker()
        f.start_frontend("--router", "round-robin", "--stall-timeout", "1")
        await wait_for(lambda: _count(f, 2), timeout=20)
        # 1,000 tokens (~6 s at speedup 1): long enough that the serving worker is found busy
        # after the third token on a loaded machine too
        body = {"model": M, "prompt": "hang", "max_tokens": 1000, "stream": True, "seed": 5}
        body["stream_options"] = {"include_usage": True}
        started = time.monotonic()
        usage, seen, serving = await _stream_stopping_its_worker(f, body, stopped)
        assert usage is not None and usage["completion_tokens"] == body["max_tokens"]
        assert seen.attempts == 2 and seen.status == "ok"
        assert await _has(f, serving)  # still registered: only the stall timeout moved it
        assert time.monotonic() - started < 25
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        f.stop()


async def test_a_stall_with_no_other_worker_is_waited_out_not_failed(nats_server, tmp_path):
    """The only worker goes silent (SIGSTOP, still registered: ``--ttl 60``) past the frontend's
    stall timeout (1 s), then goes on, as an engine that crawls beside another's
    cold start does. A migration had nowhere to go and ended the request in an error; it is
    waited out on its worker instead, and answered in full in one attempt."""
    f = Fleet(nats_server.url, tmp_path, worker_args=("--speedup", "1", "--ttl", "60"))
    stopped: list[int] = []  # SIGSTOPped, to SIGCONT
    try:
        f.add_worker()
        f.start_frontend("--router", "round-robin", "--stall-timeout", "1")
        await wait_for(lambda: _count(f, 1), timeout=20)
        body = {"model": M, "prompt": "crawl", "max_tokens": 300, "stream": True, "seed": 5}
        body["stream_options"] = {"include_usage": True}

        async def go_on() -> None:
            # silent past a stall timeout, waited out (the first of three), then it goes on:
            # two timeouts of margin on a loaded machine
            await wait_for(lambda: _stalls_waited(f) >= 1, timeout=20)
            os.kill(stopped[0], signal.SIGCONT)

        usage, seen, _ = await _stream_stopping_its_worker(f, body, stopped, go_on, timeout=60)
        assert usage is not None and usage["completion_tokens"] == body["max_tokens"]
        assert seen.attempts == 1 and seen.status == "ok"
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        f.stop()


async def test_a_queue_longer_than_the_stall_timeout_is_waited_for_not_migrated(
    nats_server, tmp_path
):
    """One worker with one slot and a queue of six: the last waits several times the frontend's
    stall timeout (1 s) for its first token. Its worker is working all along (its step count
    moves in its load reports), so nothing is migrated: with no other worker, a migration would
    have ended those requests in errors."""
    f = Fleet(nats_server.url, tmp_path, worker_args=("--speedup", "1", "--max-num-seqs", "1"))
    try:
        f.add_worker()
        f.start_frontend("--router", "round-robin", "--stall-timeout", "1")
        await wait_for(lambda: _count(f, 1), timeout=20)
        body = {"model": M, "prompt": "queue", "max_tokens": 100, "ignore_eos": True}
        started = time.monotonic()
        async with Observations(f) as obs, httpx.AsyncClient(timeout=60) as client:
            replies = await asyncio.gather(
                *(client.post(f"{f.base_url}/v1/completions", json=body) for _ in range(6))
            )
            await wait_for(lambda: len(obs.items) == 6, timeout=10)
        assert [r.status_code for r in replies] == [200] * 6, [r.text for r in replies]
        assert time.monotonic() - started > 3.0  # the queue outlasted the stall timeout, 3 times
        assert [o.attempts for o in obs.items] == [1] * 6
    finally:
        f.stop()


async def _worker_of(fleet: Fleet, request_id: str) -> str:
    """The worker that published the request's newest token chunk (FLEET_TOKENS): the one
    serving it, whatever the other workers' last load reports say."""
    s = Subjects(fleet.prefix)
    nc = await connect_nats(fleet.nats_url, name="test-worker-of")
    try:
        msg = await nc.jetstream().get_last_msg(s.stream_name("TOKENS"), s.tok(request_id))
        return decode(msg.data or b"", TokenChunk).worker_id
    finally:
        await nc.close()


async def _stream_stopping_its_worker(
    fleet: Fleet,
    body: dict[str, Any],
    stopped: list[int],
    then: Callable[[], Awaitable[None]] | None = None,
    timeout: float = 30,
) -> tuple[dict[str, Any] | None, RequestObservation, str]:
    """Stream ``body``; after its third token SIGSTOP the worker serving it (its pid into
    ``stopped``, for the caller to SIGCONT) and await ``then``. Returns the usage, the
    request's observation and the worker that was stopped."""
    usage, n_text, serving = None, 0, ""
    async with Observations(fleet) as obs, httpx.AsyncClient(timeout=timeout) as client:
        async with client.stream("POST", f"{fleet.base_url}/v1/completions", json=body) as r:
            async for event in sse_events(r):
                n_text += bool(event["choices"])
                usage = event.get("usage") or usage
                if not stopped and n_text >= 3:
                    serving = await _serving_worker(fleet)
                    proc = fleet.group.children[serving.removeprefix(f"{fleet.prefix}-")].proc
                    stopped.append(proc.pid)
                    os.kill(proc.pid, signal.SIGSTOP)
                    if then is not None:
                        await then()
        await wait_for(lambda: len(obs.items) >= 1, timeout=10)
    return usage, obs.items[-1], serving


def _stalls_waited(fleet: Fleet) -> int:
    return fleet.log("frontend").count("request_stalled_nowhere_to_go")


async def _serving_worker(fleet: Fleet) -> str:
    async def busy() -> list[str]:
        return [w for w, v in (await fleet.ready_workers()).items() if v.get("num_running")]

    return str((await wait_for(busy, timeout=5, interval=0.1))[0])


async def test_new_worker_takes_over_new_requests(slow_fleet):
    before = set(await slow_fleet.ready_workers())
    victim = sorted(before)[0]
    slow_fleet.kill(victim)
    newcomer = slow_fleet.add_worker()
    await wait_for(lambda: _has(slow_fleet, newcomer), timeout=20)
    async with Observations(slow_fleet) as obs, httpx.AsyncClient(timeout=60) as client:
        results = await asyncio.gather(*(complete(client, slow_fleet) for _ in range(6)))
        await wait_for(lambda: len(obs.items) >= 6, timeout=10)
    assert all(r["usage"]["completion_tokens"] == 4 for r in results)
    assert newcomer in {o.worker_id for o in obs.items}
    await wait_for(lambda: _gone(slow_fleet, victim), timeout=10)


async def _has(fleet: Fleet, worker_id: str) -> bool:
    return worker_id in await fleet.ready_workers()


async def _gone(fleet: Fleet, worker_id: str) -> bool:
    return worker_id not in await fleet.ready_workers()


async def test_sigterm_drains_in_flight_work(slow_fleet):
    # 1,000 tokens (~6 s at speedup 1): the serving worker is still found busy when its lookup
    # is slow on a loaded machine (150 tokens lasted under a second); the drain stays well
    # within terminate's 30 s
    max_tokens = 1000
    async with Observations(slow_fleet) as obs, httpx.AsyncClient(timeout=60) as client:
        tasks = [
            asyncio.create_task(complete(client, slow_fleet, max_tokens=max_tokens))
            for _ in range(4)
        ]
        drained = await _serving_worker(slow_fleet)  # it holds requests mid-generation
        code = await asyncio.to_thread(slow_fleet.terminate, drained)
        results = await asyncio.gather(*tasks)
        await wait_for(lambda: len(obs.items) >= 4, timeout=10)
    assert code == 0
    assert all(r["usage"]["completion_tokens"] == max_tokens for r in results)
    finished_there = [o for o in obs.items if o.worker_id == drained]
    assert finished_there and all(o.attempts == 1 for o in finished_there)  # drained, not moved
    slow_fleet.add_worker()


async def test_saturated_fleet_sheds_with_503(nats_server, tmp_path):
    f = Fleet(nats_server.url, tmp_path, worker_args=("--speedup", "1", "--max-num-seqs", "2"))
    try:
        f.add_worker()
        f.start_frontend("--router", "round-robin", "--max-waiting-per-worker", "1")
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"model": M, "prompt": "x", "max_tokens": 100}
            rs = await asyncio.gather(
                *(client.post(f"{f.base_url}/v1/completions", json=body) for _ in range(10))
            )
        codes = sorted(r.status_code for r in rs)
        assert codes.count(200) >= 3 and 503 in codes
        shed = next(r for r in rs if r.status_code == 503)
        assert shed.headers["retry-after"] == "1"
        assert shed.json()["error"]["type"] == "service_unavailable"
    finally:
        f.stop()


async def test_a_known_model_without_workers_answers_503_and_counts_as_demand(
    nats_server, tmp_path
):
    f = Fleet(nats_server.url, tmp_path)
    try:
        worker = f.add_worker()
        f.start_frontend("--router", "round-robin", "--wait-for-worker", "0.5")
        async with httpx.AsyncClient(timeout=60) as client:
            assert (await complete(client, f))["usage"]["completion_tokens"] == 4
            f.terminate(worker)
            await wait_for(lambda: _gone(f, worker), timeout=20)
            async with Observations(f) as obs:
                r = await client.post(
                    f"{f.base_url}/v1/completions", json={"model": M, "prompt": "x"}
                )
                await wait_for(lambda: any(o.status == "shed" for o in obs.items), timeout=10)
        assert r.status_code == 503, r.text  # not 404: the model exists, its workers do not
        assert r.json()["error"]["code"] == "no_workers"
        assert r.headers["retry-after"] == "1"
    finally:
        f.stop()


async def test_a_worker_restarted_under_its_id_gives_its_requests_up_at_once(nats_server, tmp_path):
    """A pod restarts with the same worker id (kill -9, then the same --worker-id again, as
    Kubernetes does with $(POD_NAME)): the frontends see a new process (its start time changed)
    and migrate its requests at once, not at the stall timeout (60 s here); the new process
    never gets its predecessor's requests (the durable consumer of its subject is replaced)."""
    f = Fleet(nats_server.url, tmp_path / "logs", worker_args=("--speedup", "1"))
    try:
        f.add_worker()
        f.add_worker()
        f.start_frontend("--router", "round-robin", "--stall-timeout", "60")
        await wait_for(lambda: _count(f, 2), timeout=20)
        # 1,000 tokens (~6 s at speedup 1): still running when the lookup of its worker is slow
        # on a loaded machine (200 tokens lasted ~1.2 s)
        body = {"model": M, "prompt": "restart me", "max_tokens": 1000, "seed": 3}
        async with Observations(f) as obs, httpx.AsyncClient(timeout=60) as client:
            call = asyncio.create_task(
                client.post(f"{f.base_url}/v1/completions", json={**body, "stream": False})
            )
            serving = await _serving_worker(f)
            f.kill(serving)
            restarted_at, killed_wall = time.monotonic(), time.time()
            name = serving.removeprefix(f"{f.prefix}-")
            f.group.start(
                name, cli_command("worker", *f.common(), "--worker-id", serving, *f.worker_args)
            )
            r = await call
            took = time.monotonic() - restarted_at
            await wait_for(lambda: len(obs.items) >= 1, timeout=10)
            calm = await client.post(f"{f.base_url}/v1/completions", json=body)
        # at once: the TTL or the restart, then the rest of the answer; not the 60-s stall timeout
        assert r.status_code == 200 and took < 45, (r.status_code, took)
        assert obs.items[0].attempts == 2
        assert r.json()["choices"][0]["text"] == calm.json()["choices"][0]["text"]
        # the subject's consumer is the new process's own, created after the restart: the old
        # one (holding the killed attempt unacked, to be redelivered) was deleted, not reused
        nc = await connect_nats(f.nats_url, name="test-consumer")
        try:
            info = await nc.jetstream().consumer_info(
                Subjects(f.prefix).stream_name("REQUESTS"), own_consumer(serving)
            )
        finally:
            await nc.close()
        assert info.created is not None and info.num_ack_pending == 0
        created = datetime.fromisoformat(str(info.created).replace("Z", "+00:00"))
        assert created.timestamp() > killed_wall, (created, killed_wall)
    finally:
        f.stop()
