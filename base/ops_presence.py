"""A service's operations port, served and made known to the fleet.

``serve_ops`` starts the port (``ops_http``) and, with ``OpsPresence``, puts the service's
``OpsEndpoint`` in the bucket ``fleet_ops_endpoints`` every ``EVERY_S`` and deletes it on a clean
stop. The bucket forgets a key 30 s after its last put, and a reader ignores an entry older than
``STALE_S`` (an expiry reaches no watcher): a service that died leaves the list by itself.
``OpsDirectory`` follows the bucket: a frontend's ``/discovery/prometheus`` lists what it holds
beside the workers, so one Prometheus job finds every service wherever it runs, as the planner
starts and stops them, with nothing to edit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from socket import gethostname

import msgspec
import structlog
from nats.aio.client import Client as NATS
from nats.js.kv import KeyValue
from prometheus_client import CollectorRegistry

from base.cancelling import cancel_and_wait
from base.ops_http import HealthCheck, start_ops_server
from schemas.discovery import OpsEndpoint
from schemas.streams import OPS_BUCKET
from schemas.subjects import Subjects

log = structlog.get_logger("jetfleet.ops")

EVERY_S = 10.0
STALE_S = 30.0


def advertised_url(host: str, port: int) -> str:
    """How others reach a port bound on ``host`` (any address: this machine's name)."""
    reachable = host if host not in ("0.0.0.0", "::", "") else gethostname()
    return f"http://{reachable}:{port}"


def ops_key(component: str, instance: str) -> str:
    """The endpoint's key: KV keys allow ``[-/_=.a-zA-Z0-9]``; anything else becomes ``_``."""
    raw = f"{component}.{instance}"
    return "".join(c if c.isalnum() or c in "-_=." else "_" for c in raw)


class OpsPresence:
    """Keeps one service's endpoint in the bucket while it runs."""

    def __init__(
        self, nc: NATS, subjects: Subjects, endpoint: OpsEndpoint, every_s: float = EVERY_S
    ) -> None:
        self.nc, self.subjects, self.endpoint, self.every_s = nc, subjects, endpoint, every_s
        self.key = ops_key(endpoint.component, endpoint.instance)
        self._kv: KeyValue | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._kv = await self.nc.jetstream().key_value(self.subjects.bucket_name(OPS_BUCKET))
        await self._put()
        self._task = asyncio.create_task(self._keep())

    async def _put(self) -> None:
        assert self._kv is not None
        now = msgspec.structs.replace(self.endpoint, at_s=time.time())
        await self._kv.put(self.key, msgspec.msgpack.encode(now))

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await self._put()
            except Exception as exc:  # NATS away for a while: the next put restores it
                log.warning("ops_presence_put_failed", key=self.key, error=str(exc))

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None
        if self._kv is not None:
            with contextlib.suppress(Exception):  # it expires anyway
                await self._kv.delete(self.key)


async def serve_ops(
    nc: NATS,
    subjects: Subjects,
    component: str,
    port: int,
    registry: CollectorRegistry,
    health: HealthCheck,
    host: str = "127.0.0.1",
    *,
    instance: str = "",
    model: str = "",
) -> OpsPresence | None:
    """The operations port on ``port`` (-1: any free port; 0: none) and its presence in the
    fleet. ``instance`` defaults to ``host-pid``."""
    if port == 0:
        return None
    server = start_ops_server(max(port, 0), registry, health, host)
    url = advertised_url(host, server.server_port)
    name = instance or f"{gethostname()}-{os.getpid()}"
    presence = OpsPresence(nc, subjects, OpsEndpoint(component, name, url, model))
    try:
        await presence.start()
    except Exception as exc:  # the port serves anyway; Prometheus just cannot discover it
        log.warning("ops_presence_failed", component=component, error=str(exc))
    return presence


class OpsDirectory:
    """The endpoints the bucket holds (key -> endpoint), followed until stopped."""

    def __init__(self, nc: NATS, subjects: Subjects) -> None:
        self.nc, self.subjects = nc, subjects
        self.endpoints: dict[str, OpsEndpoint] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        kv = await self.nc.jetstream().key_value(self.subjects.bucket_name(OPS_BUCKET))
        self._task = asyncio.create_task(self._follow(kv))

    async def _follow(self, kv: KeyValue) -> None:
        async for entry in await kv.watchall():
            if entry is None:  # the end of the initial values
                continue
            if entry.operation in ("DEL", "PURGE") or not entry.value:
                self.endpoints.pop(entry.key, None)
                continue
            try:
                self.endpoints[entry.key] = msgspec.msgpack.decode(entry.value, type=OpsEndpoint)
            except msgspec.DecodeError:  # a newer or foreign entry: not listed
                log.warning("ops_endpoint_undecodable", key=entry.key)

    def live(self, now_s: float | None = None) -> list[OpsEndpoint]:
        """The endpoints put again within ``STALE_S``, by component and instance."""
        now = time.time() if now_s is None else now_s
        fresh = [e for e in self.endpoints.values() if now - e.at_s <= STALE_S]
        return sorted(fresh, key=lambda e: (e.component, e.instance))

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None
