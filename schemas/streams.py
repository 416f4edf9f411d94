"""Streams, consumers and buckets of a fleet, declared once as typed config.

Real Python types here (``timedelta``, ``Literal``); ``base.topology`` converts them to the
JetStream API at the edge and applies them idempotently (``jetfleet infra init``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from schemas.subjects import Subjects, model_token

Storage = Literal["file", "memory"]


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    description: str
    max_age: timedelta  # messages older than this are dropped (limits retention)
    storage: Storage = "file"
    max_bytes: int = -1  # -1: unlimited
    duplicate_window: timedelta = timedelta(minutes=2)  # Nats-Msg-Id dedupe window
    replicas: int = 1  # 3 in a clustered deployment
    # what the stream stores a message under (source, destination): a subject transform
    transform: tuple[str, str] | None = None
    max_consumers: int = -1
    """Consumers the stream allows at most; -1: the server's default (nats-server 2.15 and
    later: 1,000, its ``default_max_consumers``; unlimited before)."""
    operator_retention: bool = False
    """``max_age`` and ``max_bytes`` are the operator's (``infra init`` sets them): a component
    starting creates the stream with the defaults but never changes those of one that exists."""


@dataclass(frozen=True)
class BucketSpec:
    """A JetStream KV bucket."""

    name: str
    description: str
    ttl: timedelta | None = None  # entries older than this vanish
    history: int = 1
    storage: Storage = "file"
    replicas: int = 1


@dataclass(frozen=True)
class ObjectStoreSpec:
    name: str
    description: str
    storage: Storage = "file"
    replicas: int = 1


@dataclass(frozen=True)
class ConsumerSpec:
    """A durable pull consumer (pools, router service, planner, connectors). Not here: the
    indexer's ordered consumer (no durable state: its position lives in Redis) and each worker's
    durable push consumer of its own subject (``workers/runtime.py``)."""

    durable: str
    filter_subject: str = ""
    ack_wait: timedelta = timedelta(seconds=30)
    max_ack_pending: int = 1024
    max_deliver: int = 5
    deliver_policy: Literal["all", "new"] = "new"
    filter_subjects: tuple[str, ...] = ()  # several filters (instead of ``filter_subject``)
    ack_policy: Literal["explicit", "all"] = "explicit"  # "all": one ack covers all before it


@dataclass(frozen=True)
class FleetTopology:
    streams: tuple[StreamSpec, ...]
    buckets: tuple[BucketSpec, ...]
    object_stores: tuple[ObjectStoreSpec, ...]
    # handy lookups
    by_name: dict[str, StreamSpec] = field(default_factory=dict)


MAX_REQUEST_CONSUMERS = 16384  # workers' own consumers (and those of workers gone < 60 s ago)
WORKERS_BUCKET = "workers"
HEARTBEATS_BUCKET = "heartbeats"
MODELS_BUCKET = "models"
OPS_BUCKET = "ops_endpoints"
RUNNING_RESPONSES_BUCKET = "responses_running"
RUNNING_BATCHES_BUCKET = "batches_running"
FILES_STORE = "files"
MODEL_FILES_STORE = "model_files"
KV_SNAPSHOT_STORE = "kv_snapshots"


@dataclass(frozen=True)
class ResponsesRetention:
    """How long stored responses (and the Batch API's batches) are kept, and how many bytes of
    them at most (the oldest go first). OpenAI keeps stored responses 30 days."""

    max_age: timedelta = timedelta(days=30)
    max_bytes: int = -1
    """-1: bounded by age only. A byte bound is reserved against the server's JetStream storage
    when the stream is created (every fleet on a NATS server reserves its own): set one for a
    fleet whose responses could outgrow the disk within ``max_age``."""


def fleet_topology(
    subjects: Subjects, replicas: int = 1, responses: ResponsesRetention | None = None
) -> FleetTopology:
    responses = responses or ResponsesRetention()
    s = subjects
    p = s.prefix
    streams = (
        StreamSpec(
            name=s.stream_name("REQUESTS"),
            subjects=(f"{p}.req.>", f"{p}.submit.>"),
            description="Requests: routed to a worker, to a pool, or submitted unrouted",
            max_age=timedelta(hours=24),
            replicas=replicas,
            # one durable consumer per worker (its own subject): the server's default of 1,000
            # would refuse the thousandth worker of a fleet
            max_consumers=MAX_REQUEST_CONSUMERS,
        ),
        StreamSpec(
            name=s.stream_name("TOKENS"),
            subjects=(s.tok_all(),),
            description="Token chunks per request",
            # read back only to fill a gap in a live stream or to replay a recent request: kept
            # in memory, so bounded for one machine (was 1 h / 1 GiB: nats-server grew by ~100 MB
            # in an 8-minute soak at c=16)
            max_age=timedelta(minutes=15),
            storage="memory",
            max_bytes=256 << 20,
            replicas=replicas,
        ),
        StreamSpec(
            name=s.stream_name("KV"),
            subjects=(s.kv_all(),),
            transform=s.kv_partition_transform(),
            description="KV cache block events per worker (stored under the worker's partition)",
            max_age=timedelta(hours=24),
            max_bytes=4 << 30,
            replicas=replicas,
        ),
        StreamSpec(
            name=s.stream_name("METRICS"),
            subjects=(s.metrics_all(), s.obs_all(), s.held_all()),
            description="Worker load reports, request observations, requests frontends hold",
            max_age=timedelta(hours=24),
            replicas=replicas,
        ),
        StreamSpec(
            name=s.stream_name("SCALING"),
            subjects=(s.scale_all(),),
            description="Scaling decisions and connector status",
            max_age=timedelta(days=30),
            replicas=replicas,
        ),
        StreamSpec(
            name=s.stream_name("RESPONSES"),
            subjects=(s.resp_all(),),
            description="Stored responses (object, input items) and background responses' "
            "events; an operator sets the retention (infra init --responses-max-age/-bytes)",
            max_age=responses.max_age,
            max_bytes=responses.max_bytes,
            replicas=replicas,
            operator_retention=True,
        ),
        StreamSpec(
            name=s.stream_name("BATCHES"),
            subjects=(s.batch_all(),),
            description="The Batch API: files' metadata, batches' objects, each line's answer "
            "(one message each, deduped by custom_id) and cancels; file contents are in the "
            "files object store",
            max_age=responses.max_age,
            max_bytes=responses.max_bytes,
            replicas=replicas,
            operator_retention=True,
        ),
        StreamSpec(
            name=s.stream_name("DLQ"),
            subjects=(s.dlq_all(),),
            description="Dead letters: messages a consumer could not decode or process",
            max_age=timedelta(days=7),
            replicas=replicas,
        ),
    )
    buckets = (
        BucketSpec(
            name=s.bucket_name(WORKERS_BUCKET),
            description="Worker registrations (put on change and every 5 min; a judge deletes "
            "those whose heartbeats stopped; stale entries expire)",
            ttl=timedelta(hours=1),
            storage="memory",
            replicas=replicas,
        ),
        BucketSpec(
            name=s.bucket_name(HEARTBEATS_BUCKET),
            description="Worker heartbeats (the registration, every heartbeat interval), read "
            "by the judges of liveness, not by every frontend",
            ttl=timedelta(seconds=30),
            storage="memory",
            replicas=replicas,
        ),
        BucketSpec(
            name=s.bucket_name(OPS_BUCKET),
            description="The services' operations ports (router, indexer, planner, connector), "
            "each put every 10 s by its service, for Prometheus discovery through a frontend",
            ttl=timedelta(seconds=30),
            storage="memory",
            replicas=replicas,
        ),
        BucketSpec(
            name=s.bucket_name(RUNNING_RESPONSES_BUCKET),
            description="Background responses in progress: the frontend running each and its "
            "lease (another frontend takes over one whose lease ran out)",
            replicas=replicas,
        ),
        BucketSpec(
            name=s.bucket_name(RUNNING_BATCHES_BUCKET),
            description="Batches in progress: the frontend running each and its lease",
            replicas=replicas,
        ),
        BucketSpec(
            name=s.bucket_name(MODELS_BUCKET),
            description="Model cards",
            replicas=replicas,
        ),
    )
    stores = (
        ObjectStoreSpec(
            name=s.bucket_name(MODEL_FILES_STORE),
            description="Tokenizer files referenced by model cards",
            replicas=replicas,
        ),
        ObjectStoreSpec(
            name=s.bucket_name(FILES_STORE),
            description="The Batch API's files (input JSONL, output and error files)",
            replicas=replicas,
        ),
        ObjectStoreSpec(
            name=s.bucket_name(KV_SNAPSHOT_STORE),
            description="Prefix index snapshots (bound KV replay)",
            replicas=replicas,
        ),
    )
    return FleetTopology(
        streams=streams,
        buckets=buckets,
        object_stores=stores,
        by_name={st.name: st for st in streams},
    )


def pool_consumer(subjects: Subjects, model: str, role: str) -> ConsumerSpec:
    """The shared pull consumer every worker of a pool pulls from."""
    return ConsumerSpec(
        durable=f"pool_{model_token(model)}_{role}",
        filter_subject=subjects.req_pool(model, role),
        deliver_policy="all",
    )


def router_consumer(subjects: Subjects) -> ConsumerSpec:
    """The shared pull consumer of the router service (submit subject, all models)."""
    return ConsumerSpec(
        durable="router", filter_subject=subjects.submit_all(), deliver_policy="all"
    )


def planner_consumer(subjects: Subjects, model: str, interval_s: float) -> ConsumerSpec:
    """The planner's durable consumer of one model's metrics: acked once per interval (ack-all
    on the interval's last message, after its decisions are published), so a restarted planner
    is handed exactly the messages of the interval it had not finished. Created deliver-new:
    a new planner starts from now."""
    return ConsumerSpec(
        durable=f"planner_{model_token(model)}",
        filter_subjects=subjects.planner_inputs(model),
        ack_wait=timedelta(seconds=max(60.0, 3.0 * interval_s)),
        max_ack_pending=-1,
        max_deliver=-1,
        deliver_policy="new",  # a new planner plans from now, not from a day of history
        ack_policy="all",
    )
