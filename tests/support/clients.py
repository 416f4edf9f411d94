"""Talking to a fleet as its users do: the ``jetfleet`` CLI, the official OpenAI client, SSE
streams."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import openai
from nats.aio.client import Client as NATS


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


def openai_client(base_url: str, api_key: str = "unused", max_retries: int = 0) -> openai.OpenAI:
    """The official client on a frontend's address (``/v1`` added); no retries unless asked, so
    a test sees the first answer."""
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=max_retries)


async def sse_events(response: Any) -> AsyncIterator[dict[str, Any]]:
    """The JSON events of an OpenAI-style SSE stream (an httpx streaming response), up to
    ``[DONE]``; an error event fails the test."""
    async for line in response.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        assert "error" not in event, event
        yield event


async def subscribed(nc: NATS) -> None:
    """Return once the server has every subscription ``nc`` made so far.

    One ``flush()`` is not enough in nats-py 2.16: it writes its PING straight to the socket,
    ahead of a SUB still in the client's pending buffer, so its PONG can come back before the
    server has the subscription, and another connection's first messages miss it (seen under
    load: a benchmark lost whole requests one run in 25). The SUB goes out while the first round
    trip is awaited; the second PING follows it.
    """
    await nc.flush()
    await nc.flush()
