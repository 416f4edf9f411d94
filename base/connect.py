"""Connections to NATS and Redis, one way for every process: endless NATS reconnects with logged
connection events, credentials and TLS from the environment; RESP3 Redis clients."""

from __future__ import annotations

import contextlib
import os
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import redis.asyncio as aioredis
import structlog
from nats.aio.client import Client as NATS

log = structlog.get_logger("jetfleet.nats")


def _nats_callbacks(name: str, client: list[NATS]) -> dict[str, Callable[..., Awaitable[None]]]:
    async def error_cb(exc: Exception) -> None:
        log.warning("nats_error", client=name, error=repr(exc))

    async def disconnected_cb() -> None:
        nc = client[0] if client else None
        if nc is None or not (nc.is_closed or nc.is_draining):  # not our own close
            log.warning("nats_disconnected", client=name)

    async def reconnected_cb() -> None:
        nc = client[0] if client else None
        log.info("nats_reconnected", client=name, url=str(nc.connected_url) if nc else None)

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


async def connect_nats(url: str, name: str, **kw: Any) -> NATS:
    """Connect with endless reconnects (0.5 s apart) and structlog'd connection events.

    Credentials and TLS come from the URL and the environment (``nats_security_options``).
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
        **_nats_callbacks(name, client),
        **nats_security_options(),
        **kw,
    }
    nc = await nats.connect(url, **opts)
    client.append(nc)
    return nc


async def close_nats(nc: NATS, timeout_s: int = 5) -> None:
    """Flush what was published, then close (our subscriptions are already gone by now)."""
    with contextlib.suppress(Exception):
        await nc.flush(timeout=timeout_s)
    with contextlib.suppress(Exception):
        await nc.close()


async def connect_redis(url: str, health_check_interval_s: int = 10) -> aioredis.Redis:
    """An asyncio Redis client: RESP3, hiredis parser when installed (redis-py picks it)."""
    return aioredis.from_url(
        url,
        protocol=3,
        health_check_interval=health_check_interval_s,
        decode_responses=False,
        socket_keepalive=True,
    )
