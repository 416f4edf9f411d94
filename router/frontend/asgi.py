"""Minimal ASGI plumbing: one request (``Call``), body reading, JSON/SSE responses, disconnect
watching.

The frontend is a plain ASGI callable served by uvicorn (httptools + uvloop): no framework sits on
the hot path, so a streamed request costs one extra task (the disconnect watcher) and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from router.frontend.errors import OpenAIError

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

MAX_BODY_BYTES = 32 << 20

_JSON_HEADERS = [(b"content-type", b"application/json")]
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class BodyTooLarge(Exception):
    pass


@dataclass
class Call:
    """One HTTP request as an endpoint sees it."""

    scope: Scope
    receive: Receive
    send: Send
    ctx: dict[str, Any]  # request_id, model, ...: the access log line and the span's attributes
    traceparent: str  # W3C, for the next hop (the routed requests)
    started: float  # monotonic, when the request arrived
    max_body_mb: float

    async def body(self) -> bytes:
        """The whole body (413 past ``max_body_mb``)."""
        try:
            return await read_body(self.receive, int(self.max_body_mb * (1 << 20)))
        except BodyTooLarge:
            raise OpenAIError(
                413,
                f"Request body larger than {self.max_body_mb:g} MiB",
                code="request_too_large",
            ) from None


async def read_body(receive: Receive, limit: int = MAX_BODY_BYTES) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise asyncio.CancelledError("client went away while sending the body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


async def send_json(
    send: Send, status: int, body: bytes, extra_headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = _JSON_HEADERS + (extra_headers or [])
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_text(send: Send, status: int, body: bytes, content_type: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type)],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def start_sse(send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})


async def send_sse(send: Send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def end_sse(send: Send, data: bytes = b"") -> None:
    await send({"type": "http.response.body", "body": data, "more_body": False})


RECANCEL_S = 0.05  # a disconnected client's handler is cancelled again this often until it ends


def settle_cancellation() -> None:
    """The running task's cancellation ends where it was caught (a client that left, a stopped
    background run): take the request back (``Task.uncancel``), so the asyncio timeouts and task
    groups around it, which count the cancellations pending on their task, see none."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


class DisconnectWatcher:
    """Cancels the handler task when the client disconnects before the response is complete.

    It cancels again every ``RECANCEL_S`` until the handler leaves the ``async with``: on Python
    3.11 ``asyncio.wait_for`` swallows a cancellation that lands in the loop iteration its
    future completes in (fixed in 3.12), and nats-py awaits every request (a JetStream publish
    ack) through it, so one cancel can be lost and the generation would run on for nobody. The
    extra cancels are taken back when the block ends, so the handler uncancels once as usual."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._target = asyncio.current_task()
        self.disconnected = False
        self._cancels = 0
        self._task = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                break
        target = self._target
        while target is not None and not target.done():  # until close(): the block was left
            self._cancels += 1
            target.cancel()
            await asyncio.sleep(RECANCEL_S)

    def close(self) -> None:
        self._task.cancel()

    async def __aenter__(self) -> DisconnectWatcher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        if self._target is not None:
            for _ in range(self._cancels - 1):  # one cancellation is the handler's to settle
                self._target.uncancel()
