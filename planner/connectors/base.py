"""The connector shell: scaling decisions in, a ``Scaler`` acts, ``ScalingStatus`` out.

A connector is a durable pull consumer of ``fleet.scale.{model}.*`` in ``FLEET_SCALING`` (one
durable per connector kind and model, deliver-new: a fresh connector does not act on last
month's decisions). For each decision, in stream order:

- undecodable: dead-lettered, terminated, the connector carries on;
- ``dry_run``, a hold (``desired == current``), an id not above the last one applied for its role
  (a redelivery), or older than ``max_age_s`` (the planner has re-planned since): acked, a
  ``skipped`` status says why, nothing is done;
- otherwise: ``applying``, then the scaler's result (``applied`` or ``failed``). The message is
  kept in progress while the scaler works (a drain can outlast the ack wait) and acked after, so a
  connector that dies mid-way gets the decision again.

Decisions are applied one at a time: a scale-down drain finishes before the next decision is
looked at, so two decisions never race for the same workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry, Counter, Gauge

from base.consume import DeadLetters, pull_loop, until
from base.deadletter import DeadLetterMetrics
from base.topology import ensure_consumer
from schemas import ScalingDecided, ScalingStatus, Subjects, encode
from schemas.streams import ConsumerSpec
from schemas.subjects import model_token

log = structlog.get_logger("jetfleet.connector")


@dataclass(frozen=True)
class ScaleResult:
    ok: bool
    replicas: int
    """Replicas of the role after acting (as far as the scaler knows)."""
    detail: str = ""


class Scaler(Protocol):
    """What a connector kind implements: make ``decision`` happen, say how it went."""

    name: str

    async def scale(self, decision: ScalingDecided) -> ScaleResult: ...

    async def close(self) -> None: ...


def connector_consumer(subjects: Subjects, model: str, kind: str) -> ConsumerSpec:
    return ConsumerSpec(
        durable=f"connector_{kind}_{model_token(model)}",
        filter_subject=subjects.scale_model(model),
        ack_wait=timedelta(seconds=30),
        max_ack_pending=1,
        max_deliver=-1,
        deliver_policy="new",
    )


class ConnectorMetrics:
    """What a connector did, for its operations port: every status it published (applying,
    applied, failed, skipped) and the replicas each role had after the last decision applied."""

    def __init__(self, registry: CollectorRegistry) -> None:
        ns = "jetfleet_connector"
        self.dead_letters = DeadLetterMetrics(registry)
        self.statuses = Counter(
            f"{ns}_statuses", "Scaling statuses published", ["model", "role", "state"],
            registry=registry,
        )  # fmt: skip
        self.replicas = Gauge(
            f"{ns}_replicas", "Replicas after the last decision acted on", ["model", "role"],
            registry=registry,
        )  # fmt: skip


class ConnectorService:
    def __init__(
        self,
        nc: NATS,
        subjects: Subjects,
        model: str,
        scaler: Scaler,
        max_age_s: float = 300.0,
        heartbeat_s: float = 10.0,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.subjects = subjects
        self.model = model
        self.scaler = scaler
        self.max_age_s = max_age_s
        self.heartbeat_s = heartbeat_s
        self.last_applied: dict[str, int] = {}
        self.applied = 0
        self.metrics = ConnectorMetrics(registry or CollectorRegistry())
        self.letters = DeadLetters(
            nc, subjects, f"connector-{scaler.name}", self.metrics.dead_letters
        )

    async def status(
        self, d: ScalingDecided, state: str, replicas: int = 0, detail: str = ""
    ) -> None:
        msg = ScalingStatus(
            model=d.model,
            role=d.role,
            decision_id=d.decision_id,
            ts_s=time.time(),
            connector=self.scaler.name,
            state=state,
            replicas=replicas,
            detail=detail,
        )
        self.metrics.statuses.labels(d.model, d.role, state).inc()
        if state in ("applied", "failed"):
            self.metrics.replicas.labels(d.model, d.role).set(replicas)
        try:
            await self.js.publish(self.subjects.scale_status(d.model, d.role), encode(msg))
        except Exception as exc:  # a lost status must not stop the scaling itself
            log.warning("status_publish_failed", state=state, role=d.role, error=str(exc))

    def _skip_reason(self, d: ScalingDecided) -> str | None:
        if d.dry_run:
            return "dry run"
        if not d.changed:
            return "hold"
        if d.decision_id <= self.last_applied.get(d.role, 0):
            return f"already applied decision {self.last_applied[d.role]}"
        age = time.time() - d.ts_s
        if age > self.max_age_s:
            return f"stale: {age:.0f}s old"
        return None

    async def handle(self, msg: Msg) -> None:
        d = await self.letters.decoded(msg, ScalingDecided)
        if d is None:
            return
        skip = self._skip_reason(d)
        if skip is not None:
            if d.changed and not d.dry_run:
                await self.status(d, "skipped", d.current_replicas, skip)
            await msg.ack()
            return
        await self.status(d, "applying", d.current_replicas)
        log.info(
            "scaling",
            role=d.role,
            decision_id=d.decision_id,
            current=d.current_replicas,
            desired=d.desired_replicas,
            reasons=list(d.reasons),
        )
        work = asyncio.ensure_future(self.scaler.scale(d))
        while True:
            done, _ = await asyncio.wait({work}, timeout=self.heartbeat_s)
            if done:
                break
            with contextlib.suppress(Exception):
                await msg.in_progress()
        try:
            result = work.result()
        except Exception as exc:
            log.exception("scaling_failed", role=d.role, decision_id=d.decision_id)
            result = ScaleResult(False, d.current_replicas, f"{type(exc).__name__}: {exc}")
        self.last_applied[d.role] = d.decision_id
        self.applied += 1
        await self.status(d, "applied" if result.ok else "failed", result.replicas, result.detail)
        await msg.ack()

    async def run(self, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        stream = self.subjects.stream_name("SCALING")
        spec = connector_consumer(self.subjects, self.model, self.scaler.name)
        await ensure_consumer(self.js, stream, spec)
        psub = await self.js.pull_subscribe_bind(spec.durable, stream)
        if ready is not None:
            ready.set()
        try:
            await pull_loop(psub, until(stop, 1), self.handle, log)
        finally:
            with contextlib.suppress(Exception):
                await psub.unsubscribe()
