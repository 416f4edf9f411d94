"""A gauge sampled on the event loop: the scrape runs on the operations port's thread and cannot
await, so a process samples what needs I/O (a PING, a consumer's info) every few seconds."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable


async def sample_every(sample: Callable[[], Awaitable[None]], every_s: float) -> None:
    """``sample()`` every ``every_s`` until cancelled; a failed sample keeps the last value."""
    while True:
        with contextlib.suppress(Exception):
            await sample()
        await asyncio.sleep(every_s)


def start_sampling(
    sample: Callable[[], Awaitable[None]], every_s: float, name: str
) -> asyncio.Task[None]:
    return asyncio.create_task(sample_every(sample, every_s), name=name)
