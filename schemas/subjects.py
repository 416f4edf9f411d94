"""Every subject string of the fleet is built here and nowhere else.

Layout (prefix ``fleet`` by default, configurable so several fleets share one NATS)::

    {p}.req.{model}.w.{worker}        Request routed to one worker          FLEET_REQUESTS
    {p}.req.{model}.pool.{role}       Request any worker of a pool pulls    FLEET_REQUESTS
    {p}.submit.{model}                Request from a NATS client, unrouted  FLEET_REQUESTS
    {p}.tok.{request_id}              TokenChunk                            FLEET_TOKENS
    {p}.kv.{model}.{worker}           KvEventBatch (stored as below)        FLEET_KV
    {p}.kv.{model}.{part}.{worker}    ... under the worker's partition      (stream transform)
    {p}.metrics.{model}.{role}.{worker} WorkerLoad                          FLEET_METRICS
    {p}.obs.{model}                   RequestObservation                    FLEET_METRICS
    {p}.held.{model}.{frontend}       HeldRequests                          FLEET_METRICS
    {p}.scale.{model}.{role}          ScalingDecided                        FLEET_SCALING
    {p}.scale.status.{model}.{role}   ScalingStatus                         FLEET_SCALING
    {p}.dlq.{component}               DeadLetter                            FLEET_DLQ
    {p}.cancel.{request_id}           CancelRequested                       core NATS
    {p}.ctl.{worker}.{op}             control request/reply                 core NATS
    {p}.judges                        a liveness judge is there (1/s)       core NATS

``{model}`` is ``model_token(name)``: the served name with every character outside
``[A-Za-z0-9_-]`` replaced by ``_`` (so ``org/Model-1.5B`` becomes ``org_Model-1_5B``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_TOKEN_OK = re.compile(r"^[A-Za-z0-9_-]+$")

DEFAULT_PREFIX = "fleet"
KV_PARTITIONS = 16  # FLEET_KV's partitions of the workers (indexer groups each read some)


def kv_partition(worker_id: str) -> int:
    """The partition the stream stores a worker's KV batches under: nats-server's
    ``partition()`` transform, FNV-1a (32 bits) of the token mod ``KV_PARTITIONS``."""
    h = 0x811C9DC5
    for c in worker_id.encode():
        h = ((h ^ c) * 0x01000193) & 0xFFFFFFFF
    return h % KV_PARTITIONS


def model_token(model: str) -> str:
    """Subject-safe token for a served model name."""
    if not model:
        raise ValueError("empty model name")
    return _UNSAFE.sub("_", model)


def _token(value: str, what: str) -> str:
    if not _TOKEN_OK.match(value):
        raise ValueError(f"{what} {value!r} is not a subject-safe token")
    return value


@dataclass(frozen=True)
class Subjects:
    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        _token(self.prefix, "subject prefix")

    # requests
    def req_worker(self, model: str, worker_id: str) -> str:
        return f"{self.prefix}.req.{model_token(model)}.w.{_token(worker_id, 'worker id')}"

    def req_pool(self, model: str, role: str) -> str:
        return f"{self.prefix}.req.{model_token(model)}.pool.{_token(role, 'role')}"

    def submit(self, model: str) -> str:
        return f"{self.prefix}.submit.{model_token(model)}"

    def submit_all(self) -> str:
        return f"{self.prefix}.submit.*"

    def requests_all(self) -> str:
        return f"{self.prefix}.req.>"

    # tokens and cancels
    def tok(self, request_id: str) -> str:
        return f"{self.prefix}.tok.{_token(request_id, 'request id')}"

    def tok_all(self) -> str:
        return f"{self.prefix}.tok.>"

    def cancel(self, request_id: str) -> str:
        return f"{self.prefix}.cancel.{_token(request_id, 'request id')}"

    def cancel_all(self) -> str:
        return f"{self.prefix}.cancel.*"

    # kv events
    def kv(self, model: str, worker_id: str) -> str:
        return f"{self.prefix}.kv.{model_token(model)}.{_token(worker_id, 'worker id')}"

    def kv_all(self) -> str:
        return f"{self.prefix}.kv.>"

    def kv_partition_transform(self) -> tuple[str, str]:
        """FLEET_KV stores a worker's batches under its partition, ``fleet.kv.{model}.{p}.
        {worker}`` (the server's ``partition()``: FNV-1a of the worker id mod
        ``KV_PARTITIONS``), so several indexers can each read their part of the workers."""
        p = self.prefix
        return (
            f"{p}.kv.*.*",
            f"{p}.kv.{{{{wildcard(1)}}}}.{{{{partition({KV_PARTITIONS},2)}}}}.{{{{wildcard(2)}}}}",
        )

    def kv_partitions(self, partitions: Iterable[int]) -> list[str]:
        """Filters of the stored batches of some partitions."""
        return [f"{self.prefix}.kv.*.{p}.*" for p in partitions]

    # metrics
    def metrics(self, model: str, role: str, worker_id: str) -> str:
        return (
            f"{self.prefix}.metrics.{model_token(model)}.{_token(role, 'role')}."
            f"{_token(worker_id, 'worker id')}"
        )

    def metrics_model(self, model: str) -> str:
        """Every worker load report of ``model``."""
        return f"{self.prefix}.metrics.{model_token(model)}.>"

    def metrics_all(self) -> str:
        return f"{self.prefix}.metrics.>"

    def obs(self, model: str) -> str:
        return f"{self.prefix}.obs.{model_token(model)}"

    def obs_all(self) -> str:
        return f"{self.prefix}.obs.*"

    def held(self, model: str, frontend_id: str) -> str:
        return f"{self.prefix}.held.{model_token(model)}.{model_token(frontend_id)}"

    def held_model(self, model: str) -> str:
        return f"{self.prefix}.held.{model_token(model)}.*"

    def held_all(self) -> str:
        return f"{self.prefix}.held.*.*"

    def planner_inputs(self, model: str) -> tuple[str, ...]:
        """What the planner reads of one model: load reports, observations, held requests."""
        return (self.metrics_model(model), self.obs(model), self.held_model(model))

    # scaling
    def scale(self, model: str, role: str) -> str:
        return f"{self.prefix}.scale.{model_token(model)}.{_token(role, 'role')}"

    def scale_model(self, model: str) -> str:
        """Every role's decisions for ``model`` (not the status subjects)."""
        return f"{self.prefix}.scale.{model_token(model)}.*"

    def scale_status(self, model: str, role: str) -> str:
        return f"{self.prefix}.scale.status.{model_token(model)}.{_token(role, 'role')}"

    def scale_all(self) -> str:
        return f"{self.prefix}.scale.>"

    # control and dead letters
    def ctl(self, worker_id: str, op: str) -> str:
        return f"{self.prefix}.ctl.{_token(worker_id, 'worker id')}.{_token(op, 'op')}"

    def ctl_worker(self, worker_id: str) -> str:
        return f"{self.prefix}.ctl.{_token(worker_id, 'worker id')}.*"

    def dlq(self, component: str) -> str:
        return f"{self.prefix}.dlq.{_token(component, 'component')}"

    def dlq_all(self) -> str:
        return f"{self.prefix}.dlq.>"

    def judges(self) -> str:
        """Core NATS: a judge of workers' liveness says it is there, every second."""
        return f"{self.prefix}.judges"

    # stored and background responses (router/frontend/responses_store.py)
    def resp(self, kind: str, response_id: str) -> str:
        """``kind``: ``obj`` (the response object, its latest state), ``in`` (its input items),
        ``run`` (what a frontend needs to run it again: the engine request and the body),
        ``ev`` (a background response's stream events, in order), ``cancel`` (a cancel asked
        of a background response: kept, and heard by the frontend running it)."""
        return f"{self.prefix}.resp.{_token(kind, 'kind')}.{_token(response_id, 'response id')}"

    def resp_of(self, response_id: str) -> str:
        """Every subject of one response (a purge filter)."""
        return f"{self.prefix}.resp.*.{_token(response_id, 'response id')}"

    def resp_cancels(self) -> str:
        """Every background response's cancel (the frontends running them listen)."""
        return f"{self.prefix}.resp.cancel.*"

    def resp_all(self) -> str:
        return f"{self.prefix}.resp.>"

    # the Batch API (router/frontend/batch_store.py)
    def batch(self, kind: str, ident: str) -> str:
        """``kind``: ``file`` (a file's object), ``obj`` (a batch's object), ``out`` (its lines'
        answers, one message each), ``cancel`` (a cancel asked of it)."""
        return f"{self.prefix}.batch.{_token(kind, 'kind')}.{_token(ident, 'id')}"

    def batch_kind_all(self, kind: str) -> str:
        return f"{self.prefix}.batch.{_token(kind, 'kind')}.*"

    def batch_all(self) -> str:
        return f"{self.prefix}.batch.>"

    # names derived from the prefix (streams and buckets are per fleet too)
    def stream_name(self, base: str) -> str:
        """``FLEET_REQUESTS`` for prefix ``fleet``; ``TEAM_A_REQUESTS`` for ``team-a``."""
        return f"{self.prefix.upper().replace('-', '_')}_{base}"

    def bucket_name(self, base: str) -> str:
        return f"{self.prefix.replace('-', '_')}_{base}"

    def bucket_key(self, base: str, key: str) -> str:
        """The subject a JetStream KV bucket stores ``key`` under (a put is a publish to it)."""
        return f"$KV.{self.bucket_name(base)}.{_token(key, 'key')}"
