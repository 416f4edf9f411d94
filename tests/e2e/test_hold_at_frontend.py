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


async def _gauge(client: httpx.AsyncClient, url: str, name: str) -> float:
    text = (await client.get(f"{url}/metrics")).text
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return sum(s.value for s in family.samples)
    return -1.0


async def _held(client: httpx.AsyncClient, url: str) -> float:
    return await _gauge(client, url, "jetfleet_frontend_held_requests")


async def _complete(client: httpx.AsyncClient, url: str, prompt: str, tokens: int) -> None:
    body = {"model": M, "prompt": prompt, "max_tokens": tokens}
    r = await client.post(f"{url}/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == tokens


@pytest.mark.parametrize("hold", [1, 0])
async def test_requests_held_while_every_worker_is_busy_go_to_a_worker_that_joins(
    nats_server, tmp_path, hold: int
) -> None:
    # a worker with one slot: one long request runs, a second waits for the slot; two short
    # ones that come next are held (hold=1), or sent to wait behind them (hold=0, as before)
    f = Fleet(nats_server.url, tmp_path, worker_args=("--speedup", "1", "--max-num-seqs", "1"))
    try:
        f.add_worker()
        args = ("--router", "least-loaded", "--hold-waiting-per-worker", str(hold))
        url = f.start_frontend(*args)
        await wait_for(lambda: _count(f, 1), timeout=20)
        async with Observations(f) as obs, httpx.AsyncClient(timeout=120) as client:

            async def counts(running: float, held: float) -> bool:
                now = await _gauge(client, url, "jetfleet_frontend_in_flight")
                return now == running and await _held(client, url) == held

            # ~35 s each at speedup 1: the late worker has that long to come up
            long = [asyncio.create_task(_complete(client, url, f"long {i}", 6000)) for i in (0, 1)]
            await wait_for(lambda: counts(2, 0), timeout=20)
            short = [asyncio.create_task(_complete(client, url, f"short {i}", 50)) for i in (0, 1)]
            await wait_for(lambda: counts(2, 2) if hold else counts(4, 0), timeout=20)
            if hold:
                late = f.add_worker("--max-num-seqs", "8")
                # well before a long one ends (whose room would also let them go)
                await asyncio.wait_for(asyncio.gather(*short), 20)
                await wait_for(lambda: len(obs.items) >= 2, timeout=10)
                assert await _held(client, url) == 0
            for t in [*long, *short]:
                t.cancel()  # (the client leaves: its generation stops)
            await asyncio.gather(*long, *short, return_exceptions=True)
        if hold:
            served = [o for o in obs.items if o.status == "ok"]
            assert [(o.worker_id, o.attempts) for o in served] == [(late, 1)] * 2
    finally:
        f.stop()
