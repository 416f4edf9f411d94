"""What a worker tells the fleet besides tokens: its KV cache events and its load.

KV events (``KvEventBatch`` on ``fleet.kv.{model}.{worker}``) are relayed into the fleet's block
hashing (``workers.kv_relay``) and published every ``kv_flush_interval_s``, split to fit a NATS
message, in order. ``WorkerLoad`` reports go on ``fleet.metrics.{model}.{role}.{worker}`` every
``load_interval_s`` while the load changes, every ``load_keepalive_s`` while it stays busy, and
once when the worker goes idle; then nothing (an idle worker's silence says what its report
would).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import structlog
from nats.aio.client import Client as NATS

from schemas import KvEventBatch, WorkerLoad, encode
from schemas.kv_events import KvCacheEvent
from workers.config import WorkerConfig
from workers.engine import Engine
from workers.in_flight import InFlight
from workers.kv_batching import split_events
from workers.kv_relay import KvRelay
from workers.metrics import WorkerMetrics
from workers.registry import Registry

log = structlog.get_logger("jetfleet.worker")

IDLE_SETTLE_S = 2.0  # after the last request ends, the load is still looked at every interval


class Reporter:
    def __init__(
        self,
        cfg: WorkerConfig,
        nc: NATS,
        engine: Engine,
        registry: Registry,
        metrics: WorkerMetrics,
        flight: InFlight,
        log: Any,
    ) -> None:
        self.cfg = cfg
        self.nc = nc
        self.engine = engine
        self.registry = registry
        self.metrics = metrics
        self.flight = flight
        self.log = log
        self.reported_prefill = False  # the last load report counted prompts still to prefill
        self._kv_event_id = 0
        self._kv_relay = KvRelay(engine.kv_fleet_hashing, cfg.kv_branch_blocks)
        self._kv_pending: list[KvCacheEvent] = []
        self._kv_scheduled = False
        self._last_load: WorkerLoad | None = None  # the last report sent, its ts_s zeroed
        self._last_load_at = 0.0
        self._loop = asyncio.get_running_loop()

    # ---------------------------------------------------------------- kv events
    def on_kv_events(self, events: Sequence[KvCacheEvent]) -> None:
        self._kv_pending.extend(self._kv_relay.relay(events))
        if not self._kv_scheduled:
            self._kv_scheduled = True
            self._loop.call_later(self.cfg.kv_flush_interval_s, self.publish_kv)

    def publish_kv(self) -> None:
        """The events pending, now."""
        self._kv_scheduled = False
        events, self._kv_pending = self._kv_pending, []
        if not events:
            return
        subject = self.cfg.subjects.kv(self.cfg.model_name, self.cfg.worker_id)
        for group in split_events(events):  # each within a NATS message, in order
            self._kv_event_id += 1
            batch = KvEventBatch(
                worker_id=self.cfg.worker_id,
                model=self.cfg.model_name,
                event_id=self._kv_event_id,
                ts_s=time.time(),
                events=tuple(group),
            )
            task = asyncio.ensure_future(self.nc.publish(subject, encode(batch)))
            task.add_done_callback(log_task_error)

    # ---------------------------------------------------------------- load
    async def load_loop(self) -> None:
        while True:
            if self._quiet():  # idle: wake for work, or to look again (status) every keepalive
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.flight.working.wait(), self.cfg.load_keepalive_s)
            else:
                await asyncio.sleep(self.cfg.load_interval_s)
            if not self._quiet():
                await self.load_now()

    def _quiet(self) -> bool:
        """Nothing in flight for ``IDLE_SETTLE_S`` and the last report showed an empty engine:
        the report cannot have changed (only an admission, or a status change, changes an
        empty engine's load), so the tick is skipped without asking the engine (an idle process
        of 1,024 workers spent a fifth of its CPU on these ticks). Until then the engine is
        asked every interval, so what moves after the last request ends (a host tier taking
        the blocks it evicted) is reported."""
        last = self._last_load
        return (
            not self.flight.active
            and time.monotonic() - self.flight.finished_at >= IDLE_SETTLE_S
            and last is not None
            and idle(last)
            and last.status == self.registry.status
        )

    async def load_now(self) -> None:
        try:
            await self.publish_load()
        except Exception as exc:
            self.log.warning("load_publish_failed", error=str(exc))

    async def publish_load(self, force: bool = False) -> None:
        """Report the engine's load when it changed since the last report, else only every
        ``load_keepalive_s`` while it is busy; an idle worker says so once and then nothing
        (``force``: always). Every router and the planner hears every report: an idle fleet sent
        four identical ones a second per worker, then one, and a router treats a worker it has
        no fresh report of as idle, so an idle worker's silence says what its report would (a
        fleet of 1,024 mostly idle workers sent every frontend 1,024 reports a second)."""
        load = self.engine.load()
        self.metrics.observe_load(load)
        report = self.registry.load_report(load)
        now = time.monotonic()
        content = msgspec.structs.replace(report, ts_s=0.0)
        if (
            not force
            and content == self._last_load
            and (idle(content) or now - self._last_load_at < self.cfg.load_keepalive_s)
        ):
            return
        self._last_load, self._last_load_at = content, now
        self.reported_prefill = load.active_prefill_tokens > 0 or load.num_waiting > 0
        await self.nc.publish(
            self.cfg.subjects.metrics(self.cfg.model_name, self.cfg.role, self.cfg.worker_id),
            encode(report),
        )


def idle(report: WorkerLoad) -> bool:
    """Nothing running, waiting or holding KV blocks."""
    return report.num_running == report.num_waiting == 0 and report.kv_usage == 0.0


def log_task_error(task: asyncio.Future[Any]) -> None:
    """A background publish's error, logged (nobody awaits it)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("background_publish_failed", error=str(task.exception()))
