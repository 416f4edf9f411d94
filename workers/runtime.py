"""The worker runtime: NATS on one side, an engine on the other, in parts named for their jobs.

- ``workers.intake``: the request messages (the worker's own consumer and its pool), refused,
  fenced or admitted into the engine, kept in progress while they generate;
- ``workers.token_out``: each request's outputs flushed as ``TokenChunk``s, published again
  after a reconnect;
- ``workers.reporting``: KV cache events and ``WorkerLoad`` reports; registration is
  heartbeated by ``workers.registry``;
- ``workers.in_flight``: what they share about the requests running.

The runtime keeps what concerns the worker as a whole: a request's end (acked, logged, its span
ended), cancels (core NATS, one subscription per process: ``workers.cancels``; the engine
aborts), control ops (answered on fleet.ctl.{worker}.*), and the lifecycle:

- SIGTERM drains: status "draining", stop pulling, finish in-flight work, deregister, exit;
- an engine that dies (``EngineHooks.failed``) makes the worker leave at once: ``failure`` is
  set, the stop is requested, and the worker deregisters before anything else, without ending
  or acking its requests (their frontends migrate them).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from base.cancelling import cancel_and_wait
from base.tracing import Tracing
from schemas import CancelRequested, ControlReply, ControlRequest, WireDecodeError, decode, encode
from schemas.control import CONTROL_OPS, kv_release
from workers.config import WorkerConfig
from workers.engine import Engine, EngineHooks
from workers.feeds import ProcessFeeds
from workers.fence import Fence
from workers.in_flight import InFlight
from workers.intake import Intake
from workers.metrics import WorkerMetrics
from workers.registry import Registry
from workers.reporting import Reporter, log_task_error
from workers.request_state import ActiveRequest
from workers.token_out import TokenOut

log = structlog.get_logger("jetfleet.worker")


class WorkerRuntime:
    def __init__(
        self,
        cfg: WorkerConfig,
        engine: Engine,
        nc: NATS,
        registry: Registry,
        tokenizer: Any,
        metrics: WorkerMetrics,
        tracing: Tracing | None = None,
        feeds: ProcessFeeds | None = None,
    ) -> None:
        """``feeds``: the cancel subscription, fence probe and pool pull this worker shares
        with the other workers of its process (``workers.feeds``); None: its own."""
        self.cfg = cfg
        self.feeds = feeds or ProcessFeeds.for_connection(nc, cfg, metrics.dead_letters)
        self.engine = engine
        self.nc = nc
        self.registry = registry
        self.metrics = metrics
        self.log = log.bind(worker_id=cfg.worker_id, model=cfg.model_name)
        self.flight = InFlight(self.feeds.pool.capacity)
        self.failure: str | None = None  # why the engine died, if it did
        self.fence = Fence(nc, cfg.subjects, cfg.ttl_s, self._resume, self.feeds.probe)
        self.reporter = Reporter(cfg, nc, engine, registry, metrics, self.flight, self.log)
        self.out = TokenOut(
            cfg, nc, engine, self.fence, self.flight, self.reporter, self._finish, self.log
        )
        self.intake = Intake(
            cfg,
            nc,
            engine,
            self.feeds,
            self.fence,
            self.flight,
            tokenizer,
            metrics,
            tracing or Tracing("jetfleet-worker", cfg.worker_id, env={}),
            self.out.on_ready,
            self.log,
        )
        self._tasks: list[asyncio.Task[Any]] = []
        self._subs: list[Any] = []

    @property
    def active(self) -> dict[str, ActiveRequest]:
        return self.flight.active

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        hooks = EngineHooks(self.reporter.on_kv_events, self._kv_pulled, self._failed)
        await self.engine.start(hooks)
        s, cfg = self.cfg.subjects, self.cfg
        self._subs.append(await self.feeds.cancels.subscribe(self.active, self._on_cancel))
        self._subs.append(await self.nc.subscribe(s.ctl_worker(cfg.worker_id), cb=self._on_control))
        self._subs.append(await self.intake.subscribe())
        self._tasks += self.intake.tasks()
        self._tasks += [
            asyncio.create_task(self.reporter.load_loop(), name="load"),
            asyncio.create_task(self.fence.probe_loop(), name="fence"),
        ]
        self.flight.capacity.set()
        self.log.info("worker_consuming", subject=s.req_worker(cfg.model_name, cfg.worker_id))

    def _failed(self, reason: str) -> None:
        """The engine died: leave at once (see the module docstring)."""
        self.log.error("engine_failed", reason=reason, in_flight=len(self.active))
        self.failure = reason
        self.registry.request_stop()

    async def drain_and_stop(self) -> None:
        """Stop taking work, finish what is in flight (bounded), then stop the engine. After an
        engine failure: deregister first, and leave what was in flight to the frontends."""
        self.flight.stopping = True
        self.flight.capacity.set()  # wake the pool loop so it sees the stop
        if self.failure is not None:
            await self.registry.deregister()
        else:
            await self.registry.set_status("draining")
            self.log.info("worker_draining", in_flight=len(self.active))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.flight.idle.wait(), self.cfg.drain_timeout_s)
            for rid in list(self.active):  # drain deadline passed: abort; frontends migrate
                self.engine.abort(rid)
            await self.out.flush()
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        await self.intake.delete_consumer()
        await cancel_and_wait(self._tasks)
        await self.engine.stop()
        self.reporter.publish_kv()  # the last events, without waiting for their window
        await self.reporter.publish_load(force=True)

    def _resume(self) -> None:
        self.out.resume()

    async def republish_recent(self) -> None:
        """After a NATS reconnect (see ``TokenOut.republish_recent``)."""
        await self.out.republish_recent()

    # ---------------------------------------------------------------- a request's end
    async def _finish(self, ar: ActiveRequest) -> None:
        self.flight.finished(ar)
        self.metrics.observe_finished(ar, time.monotonic())
        if ar.span is not None:
            ar.span.end(
                {
                    "gen_ai.usage.output_tokens": ar.num_generated,
                    "gen_ai.response.finish_reasons": ar.finish_reason,
                    "jetfleet.cached_tokens": ar.cached_tokens,
                    "jetfleet.host_cached_tokens": ar.host_cached_tokens,
                },
                error=ar.error,
            )
        self.log.info(
            "request_finished",
            request_id=ar.request.request_id,
            attempt=ar.request.attempt,
            finish_reason=ar.finish_reason,
            completion_tokens=ar.num_generated,
            cached_tokens=ar.cached_tokens,
            ms=round((time.monotonic() - ar.started_at) * 1000, 2),
        )
        try:
            await ar.msg.ack()
        except Exception as exc:  # the stream may have dropped it already; nothing to redo
            self.log.warning("ack_failed", request_id=ar.request.request_id, error=str(exc))

    # ---------------------------------------------------------------- cancels, control
    async def _on_cancel(self, cancel: CancelRequested) -> None:
        ar = self.active.get(cancel.request_id)
        if ar is not None:
            self.log.info("request_cancelled", request_id=cancel.request_id, reason=cancel.reason)
            if cancel.reason == "migrated":  # its stream moved on: not even an abort chunk
                self.flight.fenced.add((cancel.request_id, ar.request.attempt))
            self.engine.abort(cancel.request_id)

    async def _on_control(self, msg: Msg) -> None:
        op = msg.subject.rsplit(".", 1)[-1]
        try:
            req = decode(msg.data, ControlRequest) if msg.data else ControlRequest()
        except WireDecodeError as exc:
            await msg.respond(encode(ControlReply(False, f"bad control request: {exc}")))
            return
        if op not in CONTROL_OPS:
            reply = ControlReply(False, f"unknown op {op!r}; known: {', '.join(CONTROL_OPS)}")
        elif op == "drain":
            asyncio.get_running_loop().call_soon(self.registry.request_stop)
            reply = ControlReply(True, "draining")
        else:
            res = await self.engine.control(op, dict(req.args))
            if res.ok and op in ("lora_load", "lora_unload"):  # routers learn it at once
                await self.registry.publish()
            data = dict(res.data)
            if op == "health":
                data |= {"in_flight": len(self.active), "status": self.registry.status}
            reply = ControlReply(res.ok, res.detail, data)
        if msg.reply:
            await msg.respond(encode(reply))

    def _kv_pulled(self, prefill_worker: str, request_id: str) -> None:
        """A remote prefill's KV landed here: the prefill worker may free its blocks."""
        subject = self.cfg.subjects.ctl(prefill_worker, "kv_release")
        body = encode(kv_release(request_id))
        task = asyncio.create_task(self.nc.publish(subject, body))
        task.add_done_callback(log_task_error)
