"""Every ``--router`` choice docs/operating/running.md names, through a real frontend onto real
workers: the request is served and its observation names the policy that routed it; ``approx``
keeps a repeated prompt on the worker that has it cached; ``pool`` workers pull only while they
have free slots, so a burst waits in the stream, not in a worker."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from base.ports import free_port
from tests.e2e.test_fleet_lifecycle import Observations, _count
from tests.support.fleet import Fleet
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

M = "jetfleet-tiny"


async def _complete(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int = 4) -> None:
    body = {"model": M, "prompt": prompt, "max_tokens": max_tokens}
    r = await client.post(f"{url}/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == max_tokens


@pytest.mark.parametrize("choice", ["random", "least-loaded", "approx"])
async def test_each_router_choice_serves_and_says_so(fleet: Fleet, choice: str) -> None:
    await wait_for(lambda: _count(fleet, 2), timeout=20)
    url = fleet.start_frontend("--router", choice, name=f"frontend-{choice}", port=free_port())
    prompt = "the same long prompt " * 20  # several blocks: approx can match on them
    async with Observations(fleet) as obs, httpx.AsyncClient(timeout=30) as client:
        for i in range(6):
            await _complete(client, url, prompt if choice == "approx" else f"{choice} {i}")
        await wait_for(lambda: len(obs.items) >= 6, timeout=10)
    assert all(o.status == "ok" for o in obs.items)
    assert {o.route.policy for o in obs.items if o.route} == {choice}
    assert all(o.route is not None for o in obs.items)
    if choice == "approx":  # after the first, the prompt's blocks are on one worker: it stays
        assert len({o.worker_id for o in obs.items[1:]}) == 1


def _max_concurrent(log: str) -> int:
    running = peak = 0
    for line in log.splitlines():
        if not line.startswith("{"):
            continue
        event = json.loads(line).get("event")
        running += {"request_started": 1, "request_finished": -1}.get(event, 0)
        peak = max(peak, running)
    return peak


async def test_pool_workers_pull_only_while_they_have_free_slots(nats_server, tmp_path) -> None:
    f = Fleet(nats_server.url, tmp_path, worker_args=("--speedup", "5", "--max-num-seqs", "2"))
    try:
        f.add_worker()
        f.add_worker()
        url = f.start_frontend("--router", "pool")
        await wait_for(lambda: _count(f, 2), timeout=20)
        # 200 tokens (~0.23 s each at speedup 5): ten of them keep both workers' two slots
        # full even when a loaded machine spreads the burst's arrival over most of a second
        # (40 tokens lasted ~50 ms: a spread-out burst could leave every worker one at a time)
        async with Observations(f) as obs, httpx.AsyncClient(timeout=60) as client:
            await asyncio.gather(*(_complete(client, url, f"burst {i}", 200) for i in range(10)))
            await wait_for(lambda: len(obs.items) >= 10, timeout=10)
        assert all(o.status == "ok" and o.attempts == 1 for o in obs.items)
        assert len({o.worker_id for o in obs.items}) == 2  # both pulled
        peaks = [_max_concurrent(f.log(name)) for name in ("worker-0", "worker-1")]
        assert max(peaks) == 2, peaks  # busy, and never more than its slots
    finally:
        f.stop()
