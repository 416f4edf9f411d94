"""The one place that turns ``schemas.streams`` typed config into JetStream API.

``ensure_topology`` creates or updates every stream, KV bucket and object store of a fleet and is
idempotent (``jetfleet infra init`` and every component at start-up call it, possibly at the same
time): a missing item is created, one whose mutable settings differ is updated, anything else is
left alone. Creation races between processes are tolerated (JetStream accepts an identical
create; a loser of the race re-reads and compares). Settings JetStream cannot change in place
(storage type) raise ``TopologyConflictError`` rather than being silently ignored.

Conversion to wire units happens here only: ``timedelta`` -> seconds (nats-py turns those into
nanoseconds), ``"file"``/``"memory"`` -> ``StorageType``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import structlog
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, NotFoundError, ServerError

from schemas.streams import (
    BucketSpec,
    ConsumerSpec,
    ObjectStoreSpec,
    ResponsesRetention,
    Storage,
    StreamSpec,
    fleet_topology,
)
from schemas.subjects import Subjects

log = structlog.get_logger("jetfleet.nats")

KV_STREAM = "KV_{}"  # nats-py's naming of the stream behind a KV bucket
OBJ_STREAM = "OBJ_{}"  # ... and behind an object store
_KV_MAX_DUPLICATE_WINDOW_S = 120.0  # nats-py's default; capped at the bucket TTL


class TopologyError(RuntimeError):
    """The fleet's streams cannot be made as it needs them: one clear line for an operator."""


class TopologyConflictError(TopologyError):
    """An existing stream differs in a setting JetStream cannot update (e.g. storage)."""


class NoStorageError(TopologyError):
    """JetStream has no room left for a stream (a full disk, or the server's store limit)."""


NO_ROOM = (10047, 10028)  # JetStream: "insufficient storage / memory resources available"


@contextlib.contextmanager
def _room_for(name: str) -> Iterator[None]:
    """JetStream's refusal for want of storage, as a ``NoStorageError`` naming the stream."""
    try:
        yield
    except ServerError as exc:
        if exc.err_code not in NO_ROOM:
            raise
        raise NoStorageError(
            f"JetStream has no room left for {name} ({exc.description}): free disk space "
            "where nats-server keeps its store, or raise its jetstream max_file_store / "
            "max_memory_store"
        ) from None


@dataclass
class TopologyReport:
    """What ``ensure_topology`` did: streams by name, buckets ``kv:NAME``, stores ``obj:NAME``."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated)


# --- typed config -> nats-py API -------------------------------------------------------------


def _storage(kind: Storage) -> api.StorageType:
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
        subject_transform=(
            api.SubjectTransform(src=spec.transform[0], dest=spec.transform[1])
            if spec.transform
            else None
        ),
        max_consumers=spec.max_consumers,
    )


def kv_stream_settings(spec: BucketSpec) -> dict[str, Any]:
    """The mutable settings of a bucket's stream, as ``StreamConfig`` fields."""
    ttl_s = spec.ttl.total_seconds() if spec.ttl else 0.0
    window_s = min(_KV_MAX_DUPLICATE_WINDOW_S, ttl_s) if ttl_s else _KV_MAX_DUPLICATE_WINDOW_S
    return {
        "description": spec.description,
        "max_age": ttl_s,
        "max_msgs_per_subject": spec.history,
        "duplicate_window": window_s,
        "num_replicas": spec.replicas,
        "allow_direct": True,
    }


def consumer_config(spec: ConsumerSpec) -> api.ConsumerConfig:
    policy = api.DeliverPolicy.ALL if spec.deliver_policy == "all" else api.DeliverPolicy.NEW
    ack = api.AckPolicy.ALL if spec.ack_policy == "all" else api.AckPolicy.EXPLICIT
    return api.ConsumerConfig(
        durable_name=spec.durable,
        filter_subject=spec.filter_subject or None,
        filter_subjects=list(spec.filter_subjects) or None,
        ack_policy=ack,
        ack_wait=spec.ack_wait.total_seconds(),
        max_ack_pending=spec.max_ack_pending,
        max_deliver=spec.max_deliver,
        deliver_policy=policy,
    )


_STREAM_MUTABLE = (
    "description",
    "max_age",
    "max_bytes",
    "duplicate_window",
    "num_replicas",
    "retention",
    "discard",
    "allow_direct",
    "subject_transform",
    "max_consumers",
)


def _norm(value: Any) -> Any:
    return sorted(value) if isinstance(value, list) else value


def stream_differences(have: api.StreamConfig, want: dict[str, Any]) -> list[str]:
    """Names of the fields in ``want`` whose value differs in ``have``."""
    return [k for k, v in want.items() if _norm(getattr(have, k)) != _norm(v)]


def _check_storage(name: str, have: api.StreamConfig, want: api.StorageType) -> None:
    if have.storage != want:
        raise TopologyConflictError(
            f"stream {name} has storage {have.storage}, wanted {want}: "
            "JetStream cannot change storage in place (delete the stream to recreate it)"
        )


# --- streams, buckets, stores ----------------------------------------------------------------


async def _stream_info_or_none(js: JetStreamContext, name: str) -> api.StreamInfo | None:
    try:
        return await js.stream_info(name)
    except NotFoundError:
        return None


async def ensure_stream(
    js: JetStreamContext,
    spec: StreamSpec,
    report: TopologyReport,
    keep_replicas: bool = False,
    keep_retention: bool = True,
) -> None:
    """Create the stream, or bring it to ``spec``; ``keep_replicas``: an existing stream keeps
    the replica count it has (what ``infra init --replicas`` chose); ``keep_retention``: an
    existing stream whose retention is the operator's keeps it."""
    want = stream_config(spec)
    info = await _stream_info_or_none(js, spec.name)
    if info is None:
        try:
            with _room_for(f"stream {spec.name}"):
                await js.add_stream(want)
            report.created.append(spec.name)
            log.info("stream_created", stream=spec.name, subjects=list(spec.subjects))
            return
        except BadRequestError:  # a sibling created it with another config meanwhile
            info = await js.stream_info(spec.name)
    _check_storage(spec.name, info.config, _storage(spec.storage))
    if keep_replicas:
        want.num_replicas = info.config.num_replicas
    if keep_retention and spec.operator_retention:  # what infra init set stays
        want.max_age, want.max_bytes = info.config.max_age, info.config.max_bytes
    wanted = {k: getattr(want, k) for k in ("subjects", *_STREAM_MUTABLE)}
    diff = stream_differences(info.config, wanted)
    if not diff:
        report.unchanged.append(spec.name)
        return
    with _room_for(f"stream {spec.name}"):
        await js.update_stream(want)
    report.updated.append(spec.name)
    log.info("stream_updated", stream=spec.name, fields=diff)


async def ensure_bucket(
    js: JetStreamContext, spec: BucketSpec, report: TopologyReport, keep_replicas: bool = False
) -> None:
    key, stream = f"kv:{spec.name}", KV_STREAM.format(spec.name)
    wanted = kv_stream_settings(spec)
    info = await _stream_info_or_none(js, stream)
    if info is not None and keep_replicas:
        wanted["num_replicas"] = info.config.num_replicas
    if info is None:
        with _room_for(f"bucket {spec.name}"):
            await js.create_key_value(
                api.KeyValueConfig(
                    bucket=spec.name,
                    description=spec.description,
                    history=spec.history,
                    ttl=wanted["max_age"] or None,
                    storage=_storage(spec.storage),
                    replicas=spec.replicas,
                    direct=True,
                )
            )  # identical concurrent creates both succeed
        report.created.append(key)
        log.info("bucket_created", bucket=spec.name)
        return
    await _update_backing_stream(js, key, stream, info, spec.storage, wanted, report)


async def _update_backing_stream(
    js: JetStreamContext,
    key: str,
    stream: str,
    info: api.StreamInfo,
    storage: Storage,
    wanted: dict[str, Any],
    report: TopologyReport,
) -> None:
    """Bring the stream behind an existing bucket or object store to ``wanted``."""
    _check_storage(stream, info.config, _storage(storage))
    diff = stream_differences(info.config, wanted)
    if not diff:
        report.unchanged.append(key)
        return
    with _room_for(key):
        await js.update_stream(info.config.evolve(**wanted))
    report.updated.append(key)
    log.info("backing_stream_updated", item=key, fields=diff)


async def ensure_object_store(
    js: JetStreamContext, spec: ObjectStoreSpec, report: TopologyReport, keep_replicas: bool = False
) -> None:
    key, stream = f"obj:{spec.name}", OBJ_STREAM.format(spec.name)
    wanted: dict[str, Any] = {"description": spec.description, "num_replicas": spec.replicas}
    info = await _stream_info_or_none(js, stream)
    if info is not None and keep_replicas:
        wanted["num_replicas"] = info.config.num_replicas
    if info is None:
        with _room_for(f"object store {spec.name}"):
            await js.create_object_store(
                spec.name,
                api.ObjectStoreConfig(
                    description=spec.description,
                    storage=_storage(spec.storage),
                    replicas=spec.replicas,
                ),
            )
        report.created.append(key)
        log.info("object_store_created", store=spec.name)
        return
    await _update_backing_stream(js, key, stream, info, spec.storage, wanted, report)


async def ensure_topology(
    js: JetStreamContext,
    subjects: Subjects,
    replicas: int | None = None,
    responses: ResponsesRetention | None = None,
) -> TopologyReport:
    """Create or update every stream, bucket and object store of the fleet ``subjects`` names.

    ``replicas``, ``responses``: what ``jetfleet infra init`` sets. Every component also calls
    this on start with ``None``: what is missing is created with one replica (and the default
    retention), and what exists keeps its replica count and an operator's retention (a
    component must never turn a cluster's R3 streams into R1)."""
    keep = replicas is None
    topo = fleet_topology(subjects, replicas or 1, responses)
    report = TopologyReport()
    for spec in topo.streams:
        await ensure_stream(js, spec, report, keep, keep_retention=responses is None)
    for bucket in topo.buckets:
        await ensure_bucket(js, bucket, report, keep)
    for store in topo.object_stores:
        await ensure_object_store(js, store, report, keep)
    return report


# --- consumers -------------------------------------------------------------------------------

_CONSUMER_MUTABLE = (
    "filter_subject",
    "filter_subjects",
    "ack_wait",
    "max_ack_pending",
    "max_deliver",
)


async def ensure_consumer(
    js: JetStreamContext, stream: str, spec: ConsumerSpec
) -> api.ConsumerInfo:
    """Create the durable pull consumer, or bring an existing one to ``spec``.

    The deliver policy of an existing consumer is kept (JetStream cannot change it).
    """
    cfg = consumer_config(spec)
    info: api.ConsumerInfo
    try:
        info = await js.consumer_info(stream, spec.durable)
    except NotFoundError:
        try:
            info = await js.add_consumer(stream, cfg)
            log.info("consumer_created", stream=stream, consumer=spec.durable)
            return info
        except BadRequestError:  # created concurrently by a sibling with another config
            info = await js.consumer_info(stream, spec.durable)
    diff = [k for k in _CONSUMER_MUTABLE if getattr(info.config, k) != getattr(cfg, k)]
    if not diff:
        return info
    cfg.deliver_policy = info.config.deliver_policy
    info = await js.add_consumer(stream, cfg)
    log.info("consumer_updated", stream=stream, consumer=spec.durable, fields=diff)
    return info
