"""``jetfleet planner``: one model's metric stream in, scaling decisions out.

The shell around the pure core (``planner.core.plan``):

- **Input**: a durable pull consumer ``planner_{model}`` of ``FLEET_METRICS`` filtered to the
  model's ``WorkerLoad`` and ``RequestObservation`` subjects, read in stream order into an
  ``IntervalCollector``. Replica counts come from discovery (ready workers per role).
- **Every ``adjustment_interval_s``**: the interval's messages are summarised, ``plan`` runs, and
  one ``ScalingDecided`` per role (holds too, so replay sees every interval) is published on
  ``fleet.scale.{model}.{role}`` with ``Nats-Msg-Id = {model}:{decision_id}``. Each decision
  carries its metrics range, the pre-interval planner state and the settings. Only then is the
  interval's last message acked (ack-all), so a planner that dies mid-interval is handed that
  interval again.
- **Restart**: the newest recorded decisions give the state before their interval and its
  metrics range; re-running that interval (deterministic) gives the state to continue from, and
  messages up to its last sequence are skipped. A new planner (no durable yet) starts from the
  stream's end, not from its history; the first interval's range starts there too.
- ``--dry-run`` publishes decisions marked ``dry_run`` (connectors skip them).

One planner per model: run a second one only as a cold standby.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from base.connect import close_nats, connect_nats
from base.connection_metrics import ConnectionGauges
from base.consume import DeadLetters, Fetch, pull_loop
from base.consumer_metrics import ConsumerPending
from base.deadletter import DeadLetterMetrics
from base.ops_http import nats_connected
from base.ops_presence import serve_ops
from base.signals import stop_event
from base.stream_read import last_per_subject, read_range
from base.topology import ensure_consumer, ensure_topology
from base.worker_watch import WorkerWatch
from planner.config import PlannerConfig
from planner.core import Decision, PlannerState, plan
from planner.records import (
    IntervalCollector,
    IntervalInput,
    decision_records,
    decode_state,
    observation_for,
    recorded_counts,
)
from schemas import ScalingDecided, Subjects, WireDecodeError, decode, encode
from schemas.streams import planner_consumer

log = structlog.get_logger("jetfleet.planner")


@dataclass(frozen=True)
class PlannerServiceConfig:
    nats_url: str
    subjects: Subjects = field(default_factory=Subjects)
    model: str = "jetfleet-tiny"
    roles: tuple[str, ...] = ("agg",)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    dry_run: bool = False
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"


class PlannerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        ns = "jetfleet_planner"
        self.dead_letters = DeadLetterMetrics(registry)
        self.predicted = Gauge(
            f"{ns}_predicted",
            "Predicted next-interval load",
            ["model", "series"],
            registry=registry,
        )
        self.desired = Gauge(
            f"{ns}_desired_replicas", "Replicas decided", ["model", "role"], registry=registry
        )
        self.current = Gauge(
            f"{ns}_current_replicas", "Ready replicas seen", ["model", "role"], registry=registry
        )
        self.decisions = Counter(
            f"{ns}_decisions",
            "Decisions by role, action and first reason",
            ["model", "role", "action", "reason"],
            registry=registry,
        )
        self.decision_seconds = Histogram(
            f"{ns}_decision_seconds",
            "Closing an interval: its messages folded, the fleet counted, the plan, the "
            "decisions published",
            ["model"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0),
            registry=registry,
        )
        # the latency targets, so alerts compare the frontends' latencies with them
        self.ttft_target = Gauge(
            f"{ns}_ttft_target_seconds",
            "The planner's time-to-first-token target (it compares the interval's p90 TTFT)",
            ["model"],
            registry=registry,
        )
        self.itl_target = Gauge(
            f"{ns}_itl_target_seconds",
            "The planner's inter-token latency target (it compares the interval's mean ITL)",
            ["model"],
            registry=registry,
        )
        self.interval_messages = Gauge(
            f"{ns}_interval_messages",
            "Metric messages in the last interval",
            ["model"],
            registry=registry,
        )

    def targets(self, model: str, cfg: PlannerConfig) -> None:
        self.ttft_target.labels(model).set(cfg.ttft_target_s)
        self.itl_target.labels(model).set(cfg.itl_target_s)

    def record(self, model: str, decisions: list[Decision], inp: IntervalInput) -> None:
        self.interval_messages.labels(model).set(len(inp.observations) + len(inp.loads))
        for d in decisions:
            self.predicted.labels(model, "rps").set(d.predicted_rps)
            self.predicted.labels(model, "isl").set(d.predicted_isl)
            self.predicted.labels(model, "osl").set(d.predicted_osl)
            self.desired.labels(model, d.role).set(d.desired)
            self.current.labels(model, d.role).set(d.current)
            action = "up" if d.desired > d.current else "down" if d.desired < d.current else "hold"
            self.decisions.labels(model, d.role, action, reason_kind(d.reasons)).inc()


def reason_kind(reasons: tuple[str, ...]) -> str:
    """A low-cardinality label for a decision's reasons (its last reason without numbers)."""
    if not reasons:
        return "none"
    last = reasons[-1]
    head = last.split(":")[0] if last.startswith("hold") else last
    return "".join(c for c in head if not c.isdigit() and c not in ".%()").strip()[:40] or "none"


async def recover(
    js: JetStreamContext, cfg: PlannerServiceConfig
) -> tuple[PlannerState, int, list[ScalingDecided]]:
    """The state to continue from and the last metrics sequence already planned."""
    s = cfg.subjects
    raw = await last_per_subject(js, s.stream_name("SCALING"), s.scale_model(cfg.model))
    recorded: list[ScalingDecided] = []
    for _seq, _subject, data in raw:
        with contextlib.suppress(WireDecodeError):
            recorded.append(decode(data, ScalingDecided))
    if not recorded:
        return PlannerState(), 0, []
    newest = max(recorded, key=lambda d: d.decision_id)
    group = sorted(
        (
            d
            for d in recorded
            if d.metrics_last_seq == newest.metrics_last_seq and d.ts_s == newest.ts_s
        ),
        key=lambda d: d.role,
    )
    messages = await read_range(
        js,
        s.stream_name("METRICS"),
        s.planner_inputs(cfg.model),
        newest.metrics_after_seq + 1,
        newest.metrics_last_seq,
    )
    collector = IntervalCollector(s, cfg.model, newest.metrics_after_seq)
    for seq, subject, data in messages:
        collector.add(seq, subject, data)
    inp = collector.close()
    obs = observation_for(inp, newest.ts_s, *recorded_counts(group))
    state, _ = plan(cfg.planner, decode_state(newest.planner_state), obs)
    log.info(
        "planner_recovered",
        decision_id=newest.decision_id,
        metrics_last_seq=newest.metrics_last_seq,
    )
    return state, newest.metrics_last_seq, group


class PlannerService:
    def __init__(
        self, cfg: PlannerServiceConfig, nc: NATS, watch: WorkerWatch, registry: CollectorRegistry
    ) -> None:
        self.cfg = cfg
        self.nc = nc
        self.js = nc.jetstream()
        self.watch = watch
        self.metrics = PlannerMetrics(registry)
        self.metrics.targets(cfg.model, cfg.planner)
        self.letters = DeadLetters(nc, cfg.subjects, "planner", self.metrics.dead_letters)
        self.state = PlannerState()
        self.collector = IntervalCollector(cfg.subjects, cfg.model)
        self.pending_ack: Any = None
        self.intervals = 0

    async def take(self, msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        if seq <= self.collector.last_seq:
            return  # planned before a restart, or a redelivery
        why = self.collector.add(seq, msg.subject, msg.data)
        if why is not None:  # acked with the interval (ack-all), not terminated
            await self.letters.record(msg, why)
        self.pending_ack = msg

    async def close_interval(self, ts_s: float) -> list[ScalingDecided]:
        started = time.perf_counter()
        inp = self.collector.close()
        model, roles = self.cfg.model, self.cfg.roles
        obs = observation_for(
            inp,
            ts_s,
            self.watch.counts(model, roles),
            self.watch.counts(model, roles, unmanaged_only=True),
        )
        pre = self.state
        self.state, decisions = plan(self.cfg.planner, pre, obs)
        records = decision_records(
            self.cfg.model, decisions, self.cfg.planner, pre, inp, self.cfg.dry_run
        )
        for rec in records:
            await self._publish(rec)
        if self.pending_ack is not None:
            with contextlib.suppress(Exception):
                await self.pending_ack.ack()
            self.pending_ack = None
        self.metrics.record(self.cfg.model, decisions, inp)
        self.metrics.decision_seconds.labels(model).observe(time.perf_counter() - started)
        self.intervals += 1
        for d in decisions:
            log.info(
                "planned" if d.changed else "hold",
                role=d.role,
                current=d.current,
                desired=d.desired,
                reasons=list(d.reasons),
                requests=obs.num_requests,
                decision_id=d.decision_id,
            )
        return records

    async def _publish(self, rec: ScalingDecided, attempts: int = 8) -> None:
        """Publish one decision, retrying through a NATS outage (the message id makes retries
        idempotent). Still failing: raise, and the restarted planner recovers from the record."""
        delay = 0.25
        for attempt in range(attempts):
            try:
                await self.js.publish(
                    self.cfg.subjects.scale(rec.model, rec.role),
                    encode(rec),
                    headers={"Nats-Msg-Id": f"{rec.model}:{rec.decision_id}"},
                )
                return
            except Exception as exc:
                if attempt == attempts - 1:
                    raise
                log.warning("decision_publish_retry", error=str(exc), decision_id=rec.decision_id)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def run(self, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        s = self.cfg.subjects
        self.state, last_seq, _ = await recover(self.js, self.cfg)
        spec = planner_consumer(s, self.cfg.model, self.cfg.planner.adjustment_interval_s)
        stream = s.stream_name("METRICS")
        info = await ensure_consumer(self.js, stream, spec)
        # what the consumer will not hand out again (a new one: everything before it existed)
        floor = info.ack_floor.stream_seq if info.ack_floor is not None else 0
        self.collector = IntervalCollector(s, self.cfg.model, max(last_seq, floor or 0))
        psub = await self.js.pull_subscribe_bind(spec.durable, stream)
        interval = self.cfg.planner.adjustment_interval_s
        next_close = time.monotonic() + interval
        if ready is not None:
            ready.set()
        log.info("planner_ready", model=self.cfg.model, roles=self.cfg.roles, interval_s=interval)

        async def next_fetch() -> Fetch | None:
            """Close every interval that is due, then fetch within what is left of the next."""
            nonlocal next_close
            while not stop.is_set():
                left = next_close - time.monotonic()
                if left > 0:
                    return Fetch(512, min(left, 1.0))
                await self.close_interval(time.time())
                next_close += interval * (1 + int(-left // interval))
            return None

        try:
            await pull_loop(psub, next_fetch, self.take, log)
        finally:
            with contextlib.suppress(Exception):
                await psub.unsubscribe()


async def run_planner(cfg: PlannerServiceConfig) -> None:
    nc = await connect_nats(cfg.nats_url, name=f"planner-{cfg.model}")
    await ensure_topology(nc.jetstream(), cfg.subjects)
    registry = CollectorRegistry()
    presence = await serve_ops(
        nc,
        cfg.subjects,
        "planner",
        cfg.metrics_port,
        registry,
        nats_connected(nc),
        cfg.metrics_host,
        model=cfg.model,
    )
    watch = WorkerWatch(nc, cfg.subjects, judge=True)  # one of the fleet's judges of liveness
    await watch.start()
    service = PlannerService(cfg, nc, watch, registry)
    connections = ConnectionGauges(registry, nc).start()
    spec = planner_consumer(cfg.subjects, cfg.model, cfg.planner.adjustment_interval_s)
    stream = cfg.subjects.stream_name("METRICS")
    backlog = ConsumerPending(registry, nc.jetstream(), stream, spec.durable).start()
    stop = stop_event()
    try:
        await service.run(stop)
    finally:
        if presence is not None:
            await presence.stop()
        connections.cancel()
        backlog.cancel()
        await watch.stop()
        await close_nats(nc)
