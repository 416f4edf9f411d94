"""A worker holds a request's new tokens for the flush window only while more of them may join
the chunk: an engine stepping slower than the window (a real one, or the mocker in real time)
gets each token published as it comes, not a window later."""

from __future__ import annotations

import itertools
import time

import httpx
import pytest

from base.connect import close_nats, connect_nats
from schemas import Subjects, TokenChunk, decode
from tests.support.clients import subscribed
from tests.support.fleet import Fleet

pytestmark = pytest.mark.integration

M = "jetfleet-tiny"


async def test_tokens_slower_than_the_window_are_published_as_they_come(
    nats_server, tmp_path
) -> None:
    """Speedup 0.05: a decode step takes ~120 ms, against a 60-ms window. Held for the window,
    every token but the first (urgent) would go out 60 ms late and the last (urgent again) on
    time, so the gap after the first chunk would be ~180 ms and the gap before the last ~60:
    a 120-ms difference. Published as they come, the gaps are the steps'."""
    window_ms = 60
    f = Fleet(
        nats_server.url,
        tmp_path,
        worker_args=("--speedup", "0.05", "--flush-interval-ms", str(window_ms)),
    )
    nc = await connect_nats(nats_server.url, name="test-token-flush")
    try:
        f.add_worker()
        url = f.start_frontend("--router", "round-robin")
        arrivals: list[tuple[float, TokenChunk]] = []

        async def on(msg) -> None:  # type: ignore[no-untyped-def]
            arrivals.append((time.monotonic(), decode(msg.data, TokenChunk)))

        await nc.subscribe(Subjects(f.prefix).tok_all(), cb=on)
        await subscribed(nc)
        async with httpx.AsyncClient(timeout=60) as client:
            r = await client.post(
                f"{url}/v1/completions",
                json={"model": M, "prompt": "slow steps", "max_tokens": 8, "ignore_eos": True},
            )
            assert r.status_code == 200, r.text
    finally:
        await close_nats(nc)
        f.stop()
    chunks = [c for _, c in arrivals]
    assert sum(len(c.token_ids) for c in chunks) == 8 and chunks[-1].finish_reason == "length"
    assert all(len(c.token_ids) == 1 for c in chunks), [len(c.token_ids) for c in chunks]
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(arrivals)]
    after_first, before_last = gaps[0], gaps[-1]
    assert after_first - before_last < window_ms / 1000, [round(g * 1000) for g in gaps]
