"""Connections to NATS and Redis, one way for every process: endless NATS reconnects with logged
connection events, credentials and TLS from the environment; RESP3 Redis clients, to one server
(``redis://``, ``rediss://``, ``unix://``) or to the primary that Sentinel names
(``redis+sentinel://[[user]:password@]host:port[,host:port...]/SERVICE[/DB]``, the sentinels'
default port 26379; the password is the data servers', ``JETFLEET_SENTINEL_PASSWORD`` the
sentinels' own if they require one)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
import structlog
from nats.aio.client import Client as NATS

log = structlog.get_logger("jetfleet.nats")


Hook = Callable[[], Awaitable[None]]


def _nats_callbacks(
    name: str, client: list[NATS], on_reconnect: list[Hook] | None = None
) -> dict[str, Callable[..., Awaitable[None]]]:
    async def error_cb(exc: Exception) -> None:
        log.warning("nats_error", client=name, error=repr(exc))

    async def disconnected_cb() -> None:
        nc = client[0] if client else None
        if nc is None or not (nc.is_closed or nc.is_draining):  # not our own close
            log.warning("nats_disconnected", client=name)

    async def reconnected_cb() -> None:
        nc = client[0] if client else None
        log.info("nats_reconnected", client=name, url=str(nc.connected_url) if nc else None)
        for hook in on_reconnect or ():
            try:
                await hook()
            except Exception as exc:  # a hook must not break the client's callbacks
                log.warning("reconnect_hook_failed", client=name, error=repr(exc))

    async def closed_cb() -> None:
        log.debug("nats_closed", client=name)

    return {
        "error_cb": error_cb,
        "disconnected_cb": disconnected_cb,
        "reconnected_cb": reconnected_cb,
        "closed_cb": closed_cb,
    }


def nats_security_options(env: dict[str, str] | None = None) -> dict[str, Any]:
    """Credentials and TLS for every component, from the environment (so every command, and
    every process ``jetfleet up`` or a connector starts, gets them without extra flags):

    - ``JETFLEET_NATS_CREDS``: a ``.creds`` file (JWT + nkey seed, decentralized auth);
    - ``JETFLEET_NATS_NKEY_SEED``: an nkey seed file;
    - ``JETFLEET_NATS_TLS_CA`` (verify the server), ``JETFLEET_NATS_TLS_CERT`` and
      ``JETFLEET_NATS_TLS_KEY`` (client certificate, mutual TLS).

    User and password go in the URL (``nats://frontend:secret@host:4222``); ``tls://`` URLs
    use the system's CAs unless ``JETFLEET_NATS_TLS_CA`` says otherwise.
    """
    env = dict(os.environ) if env is None else env
    opts: dict[str, Any] = {}
    if creds := env.get("JETFLEET_NATS_CREDS"):
        opts["user_credentials"] = creds
    if seed := env.get("JETFLEET_NATS_NKEY_SEED"):
        opts["nkeys_seed"] = seed
    ca, cert, key = (env.get(f"JETFLEET_NATS_TLS_{k}") for k in ("CA", "CERT", "KEY"))
    if ca or cert:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca or None)
        if cert:
            ctx.load_cert_chain(cert, key or None)
        opts["tls"] = ctx
    return opts


_WATCHDOGS: set[asyncio.Task[None]] = set()  # the running liveness watchdogs (kept referenced)


async def connect_nats(
    url: str,
    name: str,
    on_reconnect: list[Hook] | None = None,
    silent_after_s: float | None = 5.0,
    **kw: Any,
) -> NATS:
    """Connect with endless reconnects (0.5 s apart) and structlog'd connection events.

    ``silent_after_s``: a server that has not answered a PING for this long is given up: the
    connection is reset (``sever_nats``) and the client reconnects to another node. A node cut
    off by a partition, or paused, looks alive to TCP for minutes, and nats-py's own stale check
    (``ping_interval`` x ``max_outstanding_pings``) takes a minute and closes gracefully, which
    waits on a send buffer the dead link never drains (``watch_liveness``). None: no watchdog.

    ``url`` may list several servers of a cluster, comma-separated (``nats://a:4222,nats://b:4222``):
    the client connects to any and reconnects to the others (and to those the cluster announces).
    Credentials and TLS come from the URL and the environment (``nats_security_options``).
    ``on_reconnect``: coroutines run after every reconnect (a list the caller may fill later).
    ``kw`` overrides any option of ``nats.connect`` (including the callbacks).
    """
    client: list[NATS] = []
    opts: dict[str, Any] = {
        "name": name,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
        "connect_timeout": 5,
        "ping_interval": 20,
        "max_outstanding_pings": 3,
        "pending_size": 64 << 20,  # reconnect buffer: what we publish while disconnected
        **_nats_callbacks(name, client, on_reconnect),
        **nats_security_options(),
        **kw,
    }
    servers = [u.strip() for u in url.split(",") if u.strip()]  # a cluster: any of its nodes
    nc = NATS()
    guard_late_pongs(nc)
    await nc.connect(servers if len(servers) > 1 else url, **opts)
    client.append(nc)
    if silent_after_s is not None:
        task = asyncio.create_task(watch_liveness(nc, name, silent_after_s))
        _WATCHDOGS.add(task)
        task.add_done_callback(_WATCHDOGS.discard)
    return nc


async def watch_liveness(nc: NATS, name: str, silent_after_s: float, every_s: float = 1.0) -> None:
    """PING the server every ``every_s``; with no PONG for ``silent_after_s``, sever. Ends when
    the client is closed."""
    ok_at = time.monotonic()
    while not nc.is_closed:
        await asyncio.sleep(every_s)
        reconnects = nc.stats["reconnects"]
        if not nc.is_connected:  # reconnecting: nats-py is on it
            ok_at = time.monotonic()
            continue
        try:
            await nc.flush(timeout=silent_after_s)  # type: ignore[arg-type]
            ok_at = time.monotonic()
        except Exception:
            if nc.stats["reconnects"] != reconnects:  # that PING went to the connection before
                ok_at = time.monotonic()
                continue
            silent = time.monotonic() - ok_at
            if nc.is_connected and silent >= silent_after_s and sever_nats(nc):
                log.warning("nats_server_silent", client=name, silent_s=round(silent, 1))


def guard_late_pongs(nc: NATS) -> None:
    """Keep ``nc`` reading when a PONG comes after its ``flush()`` timed out.

    nats-py 2.16 cancels a timed-out flush's future but leaves it in its list of PONG waiters;
    the late PONG then meets it, ``set_result`` raises ``InvalidStateError``, and the client's
    read loop stops on it without a word ("nats: encountered error"): nothing more is read, no
    EOF is seen, no reconnect ever starts. A worker paused for a few seconds (SIGSTOP, a long GC,
    a loaded machine) met exactly that after its liveness check timed out. This is nats-py's own
    ``_process_pong`` with the one check added: the late PONG answers the timed-out PING, so its
    waiter is dropped and the counters advance as before. (nats.py#624 fixed the same for the
    flusher's queue.)"""

    async def process_pong() -> None:
        if nc._pongs:
            future = nc._pongs.pop(0)
            if not future.done():
                future.set_result(True)
            nc._pongs_received += 1
            nc._pings_outstanding = 0

    nc._process_pong = process_pong  # type: ignore[method-assign]


def sever_nats(nc: NATS) -> bool:
    """Reset the client's TCP connection now (RST, ``SO_LINGER`` 0) and let it reconnect.

    For a process that finds itself cut off (no PONG for a while): what it wrote meanwhile sits
    in the kernel's send buffer, and a plain close (or nats-py's own stale-connection handling)
    leaves the kernel sending it, so it lands when the link heals, long after the rest of the
    fleet has moved on. A reset discards it. nats-py has no public handle on its socket: this is
    the one place that reaches for it. Returns False when there was no socket to reset."""
    import socket
    import struct

    writer = getattr(getattr(nc, "_transport", None), "_io_writer", None)
    if writer is None or writer.transport is None:
        return False
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, ValueError):  # ValueError: a closed socket (fd -1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()  # nats-py sees the connection lost and reconnects
    return True


async def close_nats(nc: NATS, timeout_s: int = 5) -> None:
    """Flush what was published, then close (our subscriptions are already gone by now)."""
    with contextlib.suppress(Exception):
        await nc.flush(timeout=timeout_s)
    with contextlib.suppress(Exception):
        await nc.close()


SENTINEL_SCHEME = "redis+sentinel"


@dataclass(frozen=True)
class SentinelUrl:
    sentinels: list[tuple[str, int]]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None


def parse_sentinel_url(url: str) -> SentinelUrl:
    """``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/SERVICE[/DB]``."""
    usage = f"a {SENTINEL_SCHEME} URL is {SENTINEL_SCHEME}://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]"
    parts = urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        raise ValueError(f"not a {SENTINEL_SCHEME} URL: {url!r}; {usage}")
    creds, _, hosts = parts.netloc.rpartition("@")
    user, _, password = creds.partition(":") if creds else ("", "", "")
    sentinels = []
    for item in filter(None, hosts.split(",")):
        host, _, port = item.rpartition(":") if ":" in item else (item, "", "26379")
        if not host or not port.isdigit():
            raise ValueError(f"bad sentinel address {item!r}; {usage}")
        sentinels.append((host, int(port)))
    path = [p for p in parts.path.split("/") if p]
    if not sentinels or not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError(f"{url!r}: {usage}")
    return SentinelUrl(
        sentinels,
        unquote(path[0]),
        int(path[1]) if len(path) == 2 else 0,
        unquote(user) or None,
        unquote(password) or None,
    )


async def connect_redis(url: str, health_check_interval_s: int = 10) -> aioredis.Redis:
    """An asyncio Redis client: RESP3, hiredis parser when installed (redis-py picks it). With a
    ``redis+sentinel://`` URL, a client of the primary Sentinel names, found again after a
    failover (redis-py's Sentinel-managed connections; the lean routing pipe follows too)."""
    options: dict[str, Any] = {
        "protocol": 3,
        "health_check_interval": health_check_interval_s,
        "decode_responses": False,
        "socket_keepalive": True,
    }
    if not url.startswith(f"{SENTINEL_SCHEME}://"):
        return aioredis.from_url(url, **options)
    from redis.asyncio.sentinel import Sentinel

    parsed = parse_sentinel_url(url)
    sentinel_password = os.environ.get("JETFLEET_SENTINEL_PASSWORD")
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        parsed.sentinels,
        sentinel_kwargs={"password": sentinel_password, "socket_timeout": 2.0},
        socket_connect_timeout=2.0,
    )
    client: aioredis.Redis = sentinel.master_for(
        parsed.service,
        db=parsed.db,
        username=parsed.username,
        password=parsed.password,
        **options,
    )
    return client
