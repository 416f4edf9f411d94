"""Chaos: the (single) NATS server stops for 10 s under load and comes back on the same port
with its file store. Requests sent meanwhile end in a full answer or a clear 503 (never a hang
past their timeout, never a 500), and once NATS is back every request is answered again. Prints
its figures."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx
import pytest

from infra.embedded import EmbeddedNats
from tests.support.fleet import Fleet
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


async def test_nats_stopped_for_ten_seconds(tmp_path) -> None:
    nats = EmbeddedNats(tmp_path / "nats", port=0)
    nats.start()
    fleet = Fleet(nats.url, tmp_path / "logs")
    outcomes: Counter[str] = Counter()
    slowest = 0.0
    try:
        fleet.add_worker()
        fleet.add_worker()
        fleet.start_frontend("--router", "round-robin")
        url = f"{fleet.base_url}/v1/completions"
        stop = asyncio.Event()

        async def client_loop(i: int, http: httpx.AsyncClient) -> None:
            nonlocal slowest
            n = 0
            while not stop.is_set():
                n += 1
                body = {"model": "jetfleet-tiny", "prompt": f"outage {i}-{n}", "max_tokens": 16}
                t0 = time.monotonic()
                r = await http.post(url, json=body)
                slowest = max(slowest, time.monotonic() - t0)
                full = r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16
                outcomes["ok" if full else str(r.status_code)] += 1
                if r.status_code == 503:
                    await asyncio.sleep(0.2)  # a client backing off, as Retry-After asks

        async with httpx.AsyncClient(timeout=90) as http:
            loops = [asyncio.create_task(client_loop(i, http)) for i in range(8)]
            await wait_for(lambda: outcomes["ok"] >= 40, timeout=30)
            port = nats.port
            nats.stop()
            stopped_at = time.monotonic()
            await asyncio.sleep(10)  # the outage itself is the point: ten seconds of it
            nats.port = port
            nats.start()
            back = time.monotonic() - stopped_at
            before = outcomes["ok"]
            await wait_for(lambda: outcomes["ok"] >= before + 80, timeout=60)
            stop.set()
            await asyncio.gather(*loops)
        print(f"\nNATS outage of {back:.1f}s under c=8: {dict(outcomes)}; slowest {slowest:.1f}s")
        assert set(outcomes) <= {"ok", "503"}, outcomes
        assert slowest < 90
    finally:
        fleet.stop()
        nats.stop()
