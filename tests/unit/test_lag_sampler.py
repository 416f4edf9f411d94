"""The index bench's lag sampler stops even when a cancel is lost (Python 3.11's wait_for)."""

from __future__ import annotations

import asyncio
import contextlib

from tests.bench.index_scale_measure import LagSampler


async def test_stop_ends_a_sampler_whose_cancel_was_swallowed() -> None:
    """The index bench's smoke run hung in ``LagSampler.stop``: the sampling loop's cancel
    landed as ``stream_info``'s reply came in and was lost, and the loop sampled on."""
    swallowing = asyncio.Event()
    calls = 0

    async def tails() -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 2:  # the second call is the one the stop's cancel lands in, and is lost
            swallowing.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.5)
        return [0]

    async def positions() -> list[int]:
        return [0]

    lag = LagSampler(tails, positions, every_s=0.01)
    lag.start()
    await swallowing.wait()
    await asyncio.wait_for(lag.stop(), 5.0)
    assert calls >= 2
