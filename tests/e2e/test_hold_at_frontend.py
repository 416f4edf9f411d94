"""Scale out takes the queue: once every worker has a queue, a frontend holds new requests itself,
so a worker started while they wait (as the planner starts one when queues grow) serves them,
instead of their waiting behind the busy worker they would have been sent to."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.test_fleet_lifecycle import Observations, _count
from tests.support.fleet import Fleet
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

M = "jetfleet-tiny"
# ~4.6 s a request at speedup 1: the worker started late has that long to come up before the
# first request ends and its room (on the busy worker) lets a held one go there instead
TOKENS = 800


async def _gauge(client: httpx.AsyncClient, url: str, name: str) -> float:
    text = (await client.get(f"{url}/metrics")).text
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return sum(s.value for s in family.samples)
    return -1.0


async def _held(client: httpx.AsyncClient, url: str) -> float:
    return await _gauge(client, url, "jetfleet_frontend_held_requests")


async def _complete(client: httpx.AsyncClient, url: str, prompt: str) -> None:
    body = {"model": M, "prompt": prompt, "max_tokens": TOKENS}
    r = await client.post(f"{url}/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == TOKENS


@pytest.mark.parametrize("hold", [1, 0])
async def test_requests_held_while_every_worker_is_busy_go_to_a_worker_that_joins(
    nats_server, tmp_path, hold: int
) -> None:
    # one slot, and a second request waiting for it: the other two are held (hold=1) or sent
    # to wait on the worker too (hold=0, as before)
    f = Fleet(nats_server.url, tmp_path, worker_args=("--speedup", "1", "--max-num-seqs", "1"))
    try:
        f.add_worker()
        args = ("--router", "least-loaded", "--hold-waiting-per-worker", str(hold))
        url = f.start_frontend(*args)
        await wait_for(lambda: _count(f, 1), timeout=20)
        async with Observations(f) as obs, httpx.AsyncClient(timeout=120) as client:
            burst = [asyncio.create_task(_complete(client, url, f"burst {i}")) for i in range(4)]
            expected = 2.0 if hold else 0.0

            async def all_in() -> bool:  # all four accepted: two on the worker, two held or not
                running = await _gauge(client, url, "jetfleet_frontend_in_flight")
                held = await _held(client, url)
                return running + held == 4 and held == expected

            await wait_for(all_in, timeout=20)
            late = f.add_worker("--max-num-seqs", "8")
            await asyncio.gather(*burst)
            await wait_for(lambda: len(obs.items) >= 4, timeout=10)
            assert await _held(client, url) == 0
        assert all(o.status == "ok" and o.attempts == 1 for o in obs.items)
        on_late = sum(o.worker_id == late for o in obs.items)
        assert on_late == (2 if hold else 0), [o.worker_id for o in obs.items]
    finally:
        f.stop()
