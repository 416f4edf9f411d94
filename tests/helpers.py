"""Test helpers: wait on a condition instead of sleeping."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
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


async def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """``jetfleet ARGS`` as a user runs it, off the event loop; ``env`` adds to the environment."""
    from infra.command import cli_command

    return await asyncio.to_thread(
        subprocess.run,
        cli_command(*args),
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


async def sse_events(response: Any) -> AsyncIterator[dict[str, Any]]:
    """The JSON events of an OpenAI-style SSE stream (an httpx streaming response), up to
    ``[DONE]``; an error event fails the test."""
    async for line in response.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        assert "error" not in event, event
        yield event
