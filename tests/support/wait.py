"""Waiting on a condition instead of sleeping."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any


async def wait_for(
    condition: Callable[[], Any | Awaitable[Any]], timeout: float = 10.0, interval: float = 0.05
) -> Any:
    """Poll ``condition`` (sync or async) until it is truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = condition()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value {last!r})")
        await asyncio.sleep(interval)
