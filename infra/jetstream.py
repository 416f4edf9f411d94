"""Connections, and the one place that turns ``schemas.streams`` typed config into JetStream API.

``ensure_topology`` creates or updates every stream, KV bucket and object store of a fleet and is
idempotent (``jetfleet infra init`` and every component at start-up call it).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import nats
import structlog
from nats.js import api
from nats.js.errors import BadRequestError, NotFoundError

from schemas.streams import BucketSpec, ConsumerSpec, ObjectStoreSpec, StreamSpec, fleet_topology
from schemas.subjects import Subjects

log = structlog.get_logger("jetfleet.nats")


@dataclass
class TopologyReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


async def connect_nats(url: str, name: str, **kw: Any) -> nats.NATS:
    async def error_cb(exc: Exception) -> None:
        log.warning("nats_error", client=name, error=repr(exc))

    closing = {"nc": None}

    async def disconnected_cb() -> None:
        nc = closing["nc"]
        if nc is None or not (nc.is_closed or nc.is_draining):  # not our own close
            log.warning("nats_disconnected", client=name)

    async def reconnected_cb() -> None:
        log.info("nats_reconnected", client=name)

    opts: dict[str, Any] = {
        "name": name,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
        "connect_timeout": 5,
        "error_cb": error_cb,
        "disconnected_cb": disconnected_cb,
        "reconnected_cb": reconnected_cb,
        "pending_size": 64 << 20,
        **kw,
    }
    nc = await nats.connect(url, **opts)
    closing["nc"] = nc
    return nc


async def close_nats(nc: Any, timeout_s: float = 5.0) -> None:
    """Flush what was published, then close (our subscriptions are already gone by now)."""
    with contextlib.suppress(Exception):
        await nc.flush(timeout=timeout_s)
    with contextlib.suppress(Exception):
        await nc.close()


async def connect_redis(url: str) -> Any:
    import redis.asyncio as aioredis

    return aioredis.from_url(url, protocol=3, health_check_interval=10, decode_responses=False)


def _storage(kind: str) -> api.StorageType:
    return api.StorageType.MEMORY if kind == "memory" else api.StorageType.FILE


def stream_config(spec: StreamSpec) -> api.StreamConfig:
    return api.StreamConfig(
        name=spec.name,
        description=spec.description,
        subjects=list(spec.subjects),
        retention=api.RetentionPolicy.LIMITS,
        discard=api.DiscardPolicy.OLD,
        max_age=spec.max_age.total_seconds(),
        max_bytes=spec.max_bytes,
        storage=_storage(spec.storage),
        duplicate_window=spec.duplicate_window.total_seconds(),
        num_replicas=spec.replicas,
        allow_direct=True,
    )


def _differs(have: api.StreamConfig, want: api.StreamConfig) -> bool:
    keys = ("subjects", "max_age", "max_bytes", "duplicate_window", "num_replicas", "description")
    return any(
        (sorted(getattr(have, k) or []) if k == "subjects" else getattr(have, k))
        != (sorted(getattr(want, k) or []) if k == "subjects" else getattr(want, k))
        for k in keys
    )


async def ensure_stream(js: Any, spec: StreamSpec, report: TopologyReport) -> None:
    want = stream_config(spec)
    try:
        info = await js.stream_info(spec.name)
    except NotFoundError:
        try:
            await js.add_stream(want)
            report.created.append(spec.name)
            return
        except BadRequestError:  # another process created it meanwhile
            info = await js.stream_info(spec.name)
    if _differs(info.config, want):
        await js.update_stream(want)
        report.updated.append(spec.name)
    else:
        report.unchanged.append(spec.name)


async def ensure_bucket(js: Any, spec: BucketSpec, report: TopologyReport) -> None:
    ttl = spec.ttl.total_seconds() if spec.ttl else None
    try:
        kv = await js.key_value(spec.name)
        status = await kv.status()
        if (status.ttl or None) == ttl and status.history == spec.history:
            report.unchanged.append(f"kv:{spec.name}")
            return
        stream = f"KV_{spec.name}"
        info = await js.stream_info(stream)
        cfg = info.config
        cfg.max_age = ttl or 0
        cfg.max_msgs_per_subject = spec.history
        await js.update_stream(cfg)
        report.updated.append(f"kv:{spec.name}")
    except NotFoundError:
        await js.create_key_value(
            api.KeyValueConfig(
                bucket=spec.name,
                description=spec.description,
                history=spec.history,
                ttl=ttl,
                storage=_storage(spec.storage),
                replicas=spec.replicas,
            )
        )
        report.created.append(f"kv:{spec.name}")


async def ensure_object_store(js: Any, spec: ObjectStoreSpec, report: TopologyReport) -> None:
    try:
        await js.object_store(spec.name)
        report.unchanged.append(f"obj:{spec.name}")
    except NotFoundError:
        await js.create_object_store(
            spec.name,
            api.ObjectStoreConfig(
                description=spec.description,
                storage=_storage(spec.storage),
                replicas=spec.replicas,
            ),
        )
        report.created.append(f"obj:{spec.name}")


async def ensure_topology(js: Any, subjects: Subjects, replicas: int = 1) -> TopologyReport:
    topo = fleet_topology(subjects, replicas)
    report = TopologyReport()
    for spec in topo.streams:
        await ensure_stream(js, spec, report)
    for bucket in topo.buckets:
        await ensure_bucket(js, bucket, report)
    for store in topo.object_stores:
        await ensure_object_store(js, store, report)
    return report


def consumer_config(spec: ConsumerSpec) -> api.ConsumerConfig:
    return api.ConsumerConfig(
        durable_name=spec.durable,
        filter_subject=spec.filter_subject,
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=spec.ack_wait.total_seconds(),
        max_ack_pending=spec.max_ack_pending,
        max_deliver=spec.max_deliver,
        deliver_policy=api.DeliverPolicy.ALL
        if spec.deliver_policy == "all"
        else api.DeliverPolicy.NEW,
    )


async def ensure_consumer(js: Any, stream: str, spec: ConsumerSpec) -> None:
    """Create the durable pull consumer, or bring an existing one to ``spec``."""
    cfg = consumer_config(spec)
    try:
        info = await js.consumer_info(stream, spec.durable)
    except NotFoundError:
        with contextlib.suppress(BadRequestError):  # created concurrently by a sibling
            await js.add_consumer(stream, cfg)
        return
    have = info.config
    if (have.ack_wait, have.max_ack_pending, have.max_deliver) != (
        cfg.ack_wait,
        cfg.max_ack_pending,
        cfg.max_deliver,
    ):
        cfg.deliver_policy = have.deliver_policy  # cannot change on an existing consumer
        await js.add_consumer(stream, cfg)
