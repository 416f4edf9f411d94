"""A lean pipelined Redis connection for the prefix index's script calls (the routing hot path).

redis-py's asyncio client spends several times a loopback round trip in Python per command
(connection pool, timeouts, events, observability, pure-Python packing), and the routing step is one
script call per request (measured: docs/benchmarks.md, "Measurements behind design choices").
``RespPipe`` keeps one connection and pipelines on it: each call is packed by hiredis and queued,
the calls made in one turn of the event loop go out in one write at its end (auto-pipelining: one
system call for the calls of many requests, and on loopback the sender also pays the receiver's side
of TCP), and the replies, which Redis sends in request order, resolve the waiting futures in that
order (parsed by hiredis). Concurrent callers share the connection without waiting for each other; a
cancelled caller's reply is read and dropped, so the order never slips.

Supported: plain TCP or unix-socket connections with an optional username/password and db —
what ``base.connect.connect_redis`` builds from ``redis://`` and ``unix://`` URLs — and the
primary of a Sentinel-managed client (``redis+sentinel://``): each (re)connection asks the
client's sentinels where the primary is, and a ``READONLY`` reply (the server was demoted in a
failover) drops the connection, so the next call finds the new primary. For any other client
(TLS, a custom connection class) ``for_client`` returns None and callers keep using redis-py.

Errors: a refused or lost connection raises ``redis.exceptions.ConnectionError`` for every call in
flight (what callers of redis-py already handle) and the next call connects again; error replies
raise ``ResponseError`` (``NoScriptError`` for NOSCRIPT, ``NoPermissionError`` for NOPERM). A
reply later than ``call_timeout_s`` (5 s; pipelined replies too) raises ``TimeoutError`` from
redis and drops the connection: a host gone without a reset is found again by the next call.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import hiredis
from redis.asyncio.connection import Connection, UnixDomainSocketConnection
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import (
    BusyLoadingError,
    NoPermissionError,
    NoScriptError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

Arg = str | bytes | int | float

# What a lost, refused or demoted Redis raises, through redis-py or this pipe: a routing step or
# an indexer waits it out (MasterNotFoundError and BusyLoadingError are ConnectionErrors;
# ReadOnlyError: a primary demoted in a failover).
REDIS_UNREACHABLE: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    ReadOnlyError,
    OSError,
    TimeoutError,
)

CONNECT_TIMEOUT_S = 5.0

# hiredis' stub types the argument as a 1-tuple; it takes a tuple of any length
_pack = cast(Callable[[tuple[Arg, ...]], bytes], hiredis.pack_command)


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.reader = hiredis.Reader()
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.transport: asyncio.Transport | None = None
        self.lost: Exception | None = None
        self._out: list[bytes] = []  # sent this tick, written together at its end

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            fut = self.waiting.popleft()
            if fut.done():  # its caller was cancelled
                continue
            if isinstance(reply, hiredis.ReplyError):
                msg = str(reply)
                if msg.startswith("READONLY") and self.transport is not None:
                    # a demoted primary: this call and every one after it on this connection
                    # fail as unreachable, and the next call connects to the primary again
                    fut.set_exception(RedisConnectionError(f"Redis primary moved: {msg}"))
                    self.transport.close()
                    continue
                word = msg.split(" ", 1)[0]
                if word in _UNAVAILABLE:  # loading, no primary, a resharding: try later
                    fut.set_exception(_UNAVAILABLE[word](f"Redis unavailable: {msg}"))
                    continue
                fut.set_exception(_ERRORS.get(word, ResponseError)(msg))
            else:
                fut.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = RedisConnectionError(f"Redis connection lost: {exc or 'closed'}")
        while self.waiting:
            fut = self.waiting.popleft()
            if not fut.done():
                fut.set_exception(self.lost)

    def send(self, payload: bytes, n: int) -> list[asyncio.Future[Any]]:
        if self.lost is not None or self.transport is None:
            raise self.lost or RedisConnectionError("Redis connection closed")
        loop = asyncio.get_running_loop()
        futs = [loop.create_future() for _ in range(n)]
        for f in futs:  # an error nobody awaits any more (caller cancelled) is not "unretrieved"
            f.add_done_callback(_retrieve)
        if not self._out:
            loop.call_soon(self._write)
        self._out.append(payload)
        self.waiting.extend(futs)
        return futs

    def _write(self) -> None:
        """Everything sent since the last write, in one write (one system call for the calls of
        many requests: on loopback the sender also pays the receiver's side of TCP)."""
        out, self._out = self._out, []
        transport = self.transport
        if out and transport is not None and not transport.is_closing():
            transport.write(out[0] if len(out) == 1 else b"".join(out))


# error replies by their first word, as redis-py classifies them
_ERRORS: dict[str, type[ResponseError]] = {
    "NOSCRIPT": NoScriptError,
    "NOPERM": NoPermissionError,
}


# ... and those that mean "this server cannot serve now", which callers treat as unreachable
_UNAVAILABLE: dict[str, type[RedisConnectionError]] = {
    "LOADING": BusyLoadingError,
    "MASTERDOWN": RedisConnectionError,
    "TRYAGAIN": RedisConnectionError,
}
FAIL_FAST_S = 0.5  # after a failed connect, calls fail at once for this long (no 5 s queue)
CALL_TIMEOUT_S = 5.0  # a reply later than this: the connection is dropped (a vanished host)


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


class _Sent(list[asyncio.Future[Any]]):
    """The reply futures of one ``send_many``, with the connection they were written on."""

    def __init__(self, futures: Sequence[asyncio.Future[Any]], proto: _Protocol) -> None:
        super().__init__(futures)
        self.proto = proto


class RespPipe:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 6379,
        path: str | None = None,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        locate: Callable[[], Awaitable[tuple[str, int]]] | None = None,
    ) -> None:
        """``locate``: where the server is now, asked on every (re)connection (Sentinel)."""
        self.host, self.port, self.path = host, port, path
        self.locate = locate
        self._failed: tuple[float, RedisConnectionError] | None = None
        self.db, self.username, self.password = db, username, password
        self._proto: _Protocol | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Lock | None = None
        self.call_timeout_s = CALL_TIMEOUT_S

    @classmethod
    def for_client(cls, redis: Any) -> RespPipe | None:
        """A pipe to the server of a redis-py asyncio client, or None if it is not a plain
        TCP / unix-socket one."""
        pool = getattr(redis, "connection_pool", None)
        if isinstance(pool, SentinelConnectionPool) and pool.is_master:
            kw = pool.connection_kwargs
            return cls(
                db=int(kw.get("db", 0) or 0),
                username=kw.get("username"),
                password=kw.get("password"),
                locate=pool.get_master_address,
            )
        if pool is None or pool.connection_class not in (Connection, UnixDomainSocketConnection):
            return None
        kw = pool.connection_kwargs
        return cls(
            host=kw.get("host", "127.0.0.1"),
            port=int(kw.get("port", 6379)),
            path=kw.get("path") if pool.connection_class is UnixDomainSocketConnection else None,
            db=int(kw.get("db", 0) or 0),
            username=kw.get("username"),
            password=kw.get("password"),
        )

    async def _connected(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        proto = self._proto
        if proto is not None and proto.lost is None and self._loop is loop:
            return proto
        if self._connecting is None or self._loop is not loop:
            self._connecting, self._loop, self._proto = asyncio.Lock(), loop, None
        async with self._connecting:
            if self._proto is not None and self._proto.lost is None:
                return self._proto
            if self._failed is not None and time.monotonic() - self._failed[0] < FAIL_FAST_S:
                raise self._failed[1]
            try:
                self._proto = await self._connect(loop)
            except RedisConnectionError as exc:
                self._failed = (time.monotonic(), exc)
                raise
            self._failed = None
            return self._proto

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Protocol:
        if self.locate is not None:
            try:
                self.host, self.port = await self.locate()
            except (RedisError, OSError) as exc:
                raise RedisConnectionError(f"Redis primary unknown: {exc}") from exc
        try:
            if self.path:
                conn = loop.create_unix_connection(_Protocol, self.path)
            else:
                conn = loop.create_connection(_Protocol, self.host, self.port)
            _, proto = await asyncio.wait_for(conn, CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            raise RedisConnectionError(f"Redis unreachable: {exc}") from exc
        setup: list[tuple[Arg, ...]] = []
        if self.password:
            auth: tuple[Arg, ...] = (
                (self.username, self.password) if self.username else (self.password,)
            )
            setup.append(("AUTH", *auth))
        if self.db:
            setup.append(("SELECT", self.db))
        if setup:
            payload = b"".join(_pack(c) for c in setup)
            await asyncio.gather(*proto.send(payload, len(setup)))
        return proto

    async def call(self, *args: Arg) -> Any:
        proto = self._proto if self._proto is not None and self._proto.lost is None else None
        if proto is None or self._loop is not asyncio.get_running_loop():
            proto = await self._connected()
        (fut,) = proto.send(_pack(args), 1)
        try:
            return await asyncio.wait_for(fut, self.call_timeout_s)
        except TimeoutError:
            raise self._timed_out(proto) from None

    def _timed_out(self, proto: _Protocol | None) -> RedisTimeoutError:
        """Drop the stuck connection (a host gone without a reset): the next call connects."""
        if proto is not None and proto.transport is not None:
            proto.transport.close()
        if proto is self._proto:
            self._proto = None
        return RedisTimeoutError(f"no reply from Redis in {self.call_timeout_s:g} s")

    async def send_many(self, commands: Sequence[Sequence[Arg]]) -> list[asyncio.Future[Any]]:
        """Write every command now, in one write; the futures of their replies, in order. Commands
        sent later on this pipe are executed after these."""
        proto = await self._connected()
        payload = b"".join(_pack(tuple(c)) for c in commands)
        return _Sent(proto.send(payload, len(commands)), proto)

    async def replies(self, futures: Sequence[asyncio.Future[Any]]) -> list[Any]:
        """The replies of ``send_many``'s futures in order (the first error raises), all within
        ``call_timeout_s`` of this wait."""
        if not futures:
            return []
        try:
            return list(await asyncio.wait_for(asyncio.gather(*futures), self.call_timeout_s))
        except TimeoutError:
            # the connection they were sent on (not a newer one a reconnect may have opened)
            raise self._timed_out(futures.proto if isinstance(futures, _Sent) else None) from None

    async def call_many(self, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        """Send every command in one write; their replies in order (the first error raises)."""
        return await self.replies(await self.send_many(commands))

    def close(self) -> None:
        if self._proto is not None and self._proto.transport is not None:
            self._proto.transport.close()
        self._proto = None
