"""``RespPipe`` against a real redis-server: the calls of one event-loop turn go out in one write
and come back in order; calls queued for a write that never happens (the connection closed first)
fail as unreachable instead of hanging."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from infra.embedded import EmbeddedRedis
from router.kv.resp import RespPipe

pytestmark = pytest.mark.integration


class CountingTransport:
    """The protocol's transport, with its writes counted."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.writes = inner, 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        self.inner.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_the_calls_of_one_turn_share_one_write_and_keep_their_order(
    redis_server: EmbeddedRedis,
) -> None:
    pipe = RespPipe(port=redis_server.port)
    key = f"t{uuid.uuid4().hex[:8]}"
    try:
        await pipe.call("PING")  # connected
        proto = pipe._proto
        assert proto is not None
        counting = CountingTransport(proto.transport)
        proto.transport = counting  # type: ignore[assignment]
        replies = await asyncio.gather(*(pipe.call("INCR", key) for _ in range(50)))
        assert replies == list(range(1, 51))
        assert counting.writes == 1
        # and calls of later turns go out in later writes
        assert await pipe.call("GET", key) == b"50"
        assert counting.writes == 2
    finally:
        pipe.close()


async def test_calls_queued_when_the_connection_closes_fail_as_unreachable(
    redis_server: EmbeddedRedis,
) -> None:
    pipe = RespPipe(port=redis_server.port)
    await pipe.call("PING")
    calls = [asyncio.create_task(pipe.call("PING")) for _ in range(5)]
    await asyncio.sleep(0)  # the calls are queued; their write comes at the end of a turn
    pipe.close()
    results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)
    assert all(isinstance(r, RedisConnectionError) for r in results), results
    again = RespPipe(port=redis_server.port)  # and the server is fine
    try:
        assert await again.call("PING") == b"PONG"
    finally:
        again.close()
