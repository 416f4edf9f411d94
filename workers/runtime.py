"""The worker runtime: NATS consumers on one side, an engine on the other.

- requests arrive on the worker's own subject (a durable JetStream push consumer named
  ``own_{worker_id}``, manual ack, flow control; the worker deletes any predecessor's at start and
  its own when it drains; after a crash the server removes it 60 s after its subscriber left)
  and on its pool subject (a shared durable pull consumer, pulled only while there is capacity,
  by the one pull loop of its process: ``workers.pool``);
- each request's outputs are flushed as ``TokenChunk``s on fleet.tok.{request_id}: first token
  and end at once, the rest every flush interval (one flush task for the whole worker). The
  interval is ``flush_interval_s`` up to ``flush_batch_unit`` requests in flight and grows with
  the batch up to ``max_flush_interval_s``: under a big batch a token's latency is dominated by
  the engine step anyway, and the worker's message rate stays bounded instead of growing with
  the batch (measured: 354 vs 312 req/s at concurrency 64 for 20 ms vs 5 ms). A request whose
  outputs come at least an interval apart (an engine stepping in real time) is flushed at once
  (``WorkerConfig.flush_delay``): the interval would coalesce nothing and delay each token;
- the request message is kept in progress while it generates and acked when it ends; a redelivered
  message of a request already running or recently finished changes nothing;
- cancels (core NATS, one subscription per process: ``workers.cancels``) abort the request in
  the engine; control ops answer on fleet.ctl.{worker}.*;
- KV events and ``WorkerLoad`` reports are published (every ``load_interval_s`` while the load
  changes, every ``load_keepalive_s`` while it does not); registration is heartbeated;
- SIGTERM drains: status "draining", stop pulling, finish in-flight work, deregister, exit;
- an engine that dies (``EngineHooks.failed``) makes the worker leave at once: ``failure`` is
  set, the stop is requested, and the worker deregisters before anything else, without ending
  or acking its requests (their frontends migrate them).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import msgspec
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import NotFoundError

from base.consume import DeadLetters
from base.tracing import Tracing
from model.detokenize import IncrementalDetokenizer
from schemas import (
    CancelRequested,
    ControlReply,
    ControlRequest,
    KvEventBatch,
    Request,
    TokenChunk,
    WireDecodeError,
    WorkerLoad,
    decode,
    encode,
)
from schemas.control import CONTROL_OPS, kv_release
from schemas.kv_events import KvCacheEvent
from schemas.trace import HEADER as TRACE_HEADER
from schemas.trace import parse_traceparent
from schemas.validate import request_problem
from workers.config import WorkerConfig
from workers.engine import Engine, EngineHooks, EngineRequest
from workers.feeds import ProcessFeeds
from workers.fence import Fence
from workers.kv_batching import split_events
from workers.kv_relay import KvRelay
from workers.metrics import WorkerMetrics
from workers.recent_chunks import RecentChunks
from workers.registry import Registry
from workers.request_state import ActiveRequest

log = structlog.get_logger("jetfleet.worker")

_RECENT_DONE = 4096  # finished (request_id, attempt) kept to ignore redeliveries
IDLE_SETTLE_S = 2.0  # after the last request ends, the load is still looked at every interval


def own_consumer(worker_id: str) -> str:
    """The durable consumer of a worker's own request subject (a valid consumer name)."""
    return "own_" + re.sub(r"[^A-Za-z0-9_-]", "_", worker_id)


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
        self.feeds = feeds or ProcessFeeds.for_connection(nc, cfg)
        self.tracing = tracing or Tracing("jetfleet-worker", cfg.worker_id, env={})
        self.engine = engine
        self.nc = nc
        self.js = nc.jetstream()
        self.registry = registry
        self.tokenizer = tokenizer
        eos = tokenizer.eos_token
        special = tokenizer.special_tokens
        self._eos_ids = frozenset([special[eos]] if eos in special else [])
        self.metrics = metrics
        self.subjects = cfg.subjects
        self.letters = DeadLetters(nc, cfg.subjects, "worker")
        self.log = log.bind(worker_id=cfg.worker_id, model=cfg.model_name)
        self.active: dict[str, ActiveRequest] = {}
        self._done: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._dirty: set[str] = set()
        self._flush_scheduled = False
        self._urgent_scheduled = False
        self._tasks: list[asyncio.Task[Any]] = []
        self._subs: list[Any] = []
        self._capacity = self.feeds.pool.capacity  # set when a slot comes free
        self._idle = asyncio.Event()
        self._idle.set()
        self._working = asyncio.Event()  # the inverse: set while a request is in flight
        self._stopping = False
        self._kv_event_id = 0
        self._kv_relay = KvRelay(engine.kv_fleet_hashing, cfg.kv_branch_blocks)
        self._kv_pending: list[KvCacheEvent] = []
        self._kv_scheduled = False
        self._reported_prefill = False  # the last load report counted prompts still to prefill
        self._last_load: WorkerLoad | None = None  # the last report sent, its ts_s zeroed
        self._last_load_at = 0.0
        self._finished_at = 0.0  # monotonic: when the last request in flight ended
        self._recent = RecentChunks()  # published again after a NATS reconnect
        self._loop = asyncio.get_running_loop()
        self.failure: str | None = None  # why the engine died, if it did
        self.fence = Fence(nc, cfg.subjects, cfg.ttl_s, self._resume, self.feeds.probe)
        self._fenced: set[tuple[str, int]] = set()  # (id, attempt) moved on: publish nothing

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        await self.engine.start(EngineHooks(self._on_kv_events, self._kv_pulled, self._failed))
        s, cfg = self.subjects, self.cfg
        self._subs.append(await self.feeds.cancels.subscribe(self.active, self._on_cancel))
        self._subs.append(await self.nc.subscribe(s.ctl_worker(cfg.worker_id), cb=self._on_control))
        # A durable consumer (named for this worker, removed by the server 60 s after its last
        # subscriber left) inherits the stream's replicas: on a NATS cluster it survives the
        # loss of a node, where an ephemeral one (R1) would vanish with it and leave requests
        # routed to this worker unseen until the frontends' stall timeout.
        # A process restarted under the same id (a pod) must not inherit its predecessor's
        # consumer: the requests that one held unacked are migrated by the frontends, and a
        # redelivery here would generate them twice (or splice two runs into one answer).
        with contextlib.suppress(NotFoundError):
            await self.js.delete_consumer(s.stream_name("REQUESTS"), own_consumer(cfg.worker_id))
        own = await self.js.subscribe(
            s.req_worker(cfg.model_name, cfg.worker_id),
            durable=own_consumer(cfg.worker_id),
            cb=self._on_request_msg,
            manual_ack=True,
            config=api.ConsumerConfig(
                ack_wait=cfg.ack_wait_s,
                max_ack_pending=max(cfg.max_pending_requests, 1),
                inactive_threshold=60.0,
                deliver_policy=api.DeliverPolicy.NEW,
            ),
            flow_control=True,
            idle_heartbeat=5.0,
        )
        self._subs.append(own)
        self._tasks += [
            asyncio.create_task(
                self.feeds.pool.serve(self._free_slots, self._on_request_msg), name="pool"
            ),
            asyncio.create_task(self._in_progress_loop(), name="in-progress"),
            asyncio.create_task(self._load_loop(), name="load"),
            asyncio.create_task(self.fence.probe_loop(), name="fence"),
        ]
        self._capacity.set()
        self.log.info("worker_consuming", subject=s.req_worker(cfg.model_name, cfg.worker_id))

    def _failed(self, reason: str) -> None:
        """The engine died: leave at once (see the module docstring)."""
        self.log.error("engine_failed", reason=reason, in_flight=len(self.active))
        self.failure = reason
        self.registry.request_stop()

    async def drain_and_stop(self) -> None:
        """Stop taking work, finish what is in flight (bounded), then stop the engine. After an
        engine failure: deregister first, and leave what was in flight to the frontends."""
        self._stopping = True
        self._capacity.set()  # wake the pool loop so it sees the stop
        if self.failure is not None:
            await self.registry.deregister()
        else:
            await self.registry.set_status("draining")
            self.log.info("worker_draining", in_flight=len(self.active))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), self.cfg.drain_timeout_s)
            for rid in list(self.active):  # drain deadline passed: abort; frontends migrate
                self.engine.abort(rid)
            await self._flush()
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        with contextlib.suppress(Exception):  # gone for good (a crash: the server's timeout)
            await self.js.delete_consumer(
                self.subjects.stream_name("REQUESTS"), own_consumer(self.cfg.worker_id)
            )
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.engine.stop()
        self._spawn_kv_publish()  # the last events, without waiting for their window
        await self._publish_load(force=True)

    # ---------------------------------------------------------------- requests in
    async def _on_request_msg(self, msg: Msg) -> None:
        """Take one request message; whatever goes wrong with it stays with it (the consumer
        goes on, the message is terminated rather than redelivered to spread)."""
        try:
            await self._take_request(msg)
        except Exception as exc:
            self.log.error("request_failed_to_start", error=repr(exc))
            await self.letters.refuse(msg, f"worker error: {exc!r}")

    async def _take_request(self, msg: Msg) -> None:
        req = await self.letters.decoded(msg, Request)
        if req is None:
            return
        problem = request_problem(req, self.tokenizer.vocab_size)
        if problem is not None:
            # terminated (never redelivered to another worker), its client ended at once
            self.log.warning("request_refused", request_id=req.request_id[:64], reason=problem)
            await self.letters.refuse_request(msg, req, problem, self.cfg.worker_id)
            return
        key = (req.request_id, req.attempt)
        current = self.active.get(req.request_id)
        if current is not None and current.request.attempt >= req.attempt:
            return  # redelivery of what is running: keep it in progress, ack at the end
        if key in self._done:
            await msg.ack()  # redelivery of what finished: idempotent
            return
        if req.model != self.cfg.model_name:
            await self.letters.refuse(msg, f"wrong model {req.model!r}")
            return
        if self._late(msg) and await self.fence.moved_on({key}):
            self.log.info("request_fenced", request_id=req.request_id, attempt=req.attempt)
            self._done[key] = None  # delivered after routers moved it on: not run at all
            await msg.ack()
            return
        if current is not None:  # a newer attempt of a request we still run: replace it
            self.engine.abort(req.request_id)
        self._admit(req, msg)

    def _late(self, msg: Msg) -> bool:
        """Redelivered, or stored longer ago than the registration TTL: routers may have
        expired this worker meanwhile and migrated the request (see ``workers.fence``)."""
        try:
            meta = msg.metadata
        except Exception:  # not a JetStream delivery
            return False
        return meta.num_delivered > 1 or time.time() - meta.timestamp.timestamp() > self.cfg.ttl_s

    def _admit(self, req: Request, msg: Msg) -> None:
        detok = None
        if req.detokenize:
            detok = IncrementalDetokenizer(
                self.tokenizer,
                skip_special_tokens=req.skip_special_tokens,
                hide=frozenset() if req.skip_special_tokens else self._eos_ids,
            ).step
        ar = ActiveRequest(req, msg, self.cfg.worker_id, detok, self._on_ready, time.monotonic())
        self.active[req.request_id] = ar
        self._idle.clear()
        self._working.set()
        if len(self.active) >= self.engine.max_num_seqs:
            self._capacity.clear()
        self.metrics.requests_started.inc()
        traceparent = (msg.headers or {}).get(TRACE_HEADER)
        parsed = parse_traceparent(traceparent)
        if self.tracing.exporting:
            ar.span = self.tracing.start(
                f"generate {req.model}",
                traceparent,
                "consumer",
                {
                    "jetfleet.request_id": req.request_id,
                    "jetfleet.worker_id": self.cfg.worker_id,
                    "jetfleet.attempt": req.attempt,
                    "gen_ai.request.model": req.model,
                    "gen_ai.usage.input_tokens": len(req.token_ids),
                    "gen_ai.request.max_tokens": req.sampling.max_tokens,
                },
            )
        self.log.info(
            "request_started",
            request_id=req.request_id,
            trace_id=parsed[0] if parsed else None,
            attempt=req.attempt,
            prompt_tokens=len(req.token_ids),
            max_tokens=req.sampling.max_tokens,
        )
        self.engine.add_request(EngineRequest.from_request(req), ar)

    def _free_slots(self) -> int:
        """Requests the engine has room for (none once the worker stops): what the pool
        feed may hand it."""
        return 0 if self._stopping else self.engine.max_num_seqs - len(self.active)

    # ---------------------------------------------------------------- tokens out
    def _on_ready(self, ar: ActiveRequest, urgent: bool) -> None:
        self._dirty.add(ar.request.request_id)
        now = time.monotonic()
        gap, ar.last_output_at = now - ar.last_output_at, now
        delay = self.cfg.flush_delay(len(self.active), urgent, gap)
        if delay == 0.0:
            if not self._urgent_scheduled:
                self._urgent_scheduled = True
                self._loop.call_soon(self._spawn_flush)
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_later(delay, self._spawn_flush)

    def _spawn_flush(self) -> None:
        self._urgent_scheduled = False
        self._flush_scheduled = False
        task = asyncio.ensure_future(self._flush())
        task.add_done_callback(_log_task_error)

    def _resume(self) -> None:
        self._dirty.update(self.active)
        self._spawn_flush()

    async def _flush(self) -> None:
        if self.fence.holding and not self._stopping:  # cut off: nothing goes on the wire
            return  # (the dirty set stays: the fence's resume flushes it)
        dirty, self._dirty = self._dirty, set()
        publish = self.nc.publish
        tok = self.subjects.tok
        finished: list[ActiveRequest] = []
        ready = [ar for ar in map(self.active.get, dirty) if ar is not None and ar.has_pending()]
        if self._reported_prefill and any(ar.next_index == 0 for ar in ready):
            # A prefill ended and the last load report still counts it: routers get a new one
            # before these tokens (one connection keeps the order), so a client's next request
            # is not routed against the prefill of the one it just received (the worker holding
            # its prefix would look busy for up to load_interval_s). At most one per flush.
            await self._load_now()
        now = time.monotonic()
        for ar in ready:
            rid = ar.request.request_id
            subject, payload = tok(rid), encode(ar.take_chunk())
            if (rid, ar.request.attempt) not in self._fenced:
                await publish(subject, payload)
                self._recent.add(now, subject, payload)
            if ar.final_sent:
                finished.append(ar)
        for ar in finished:
            await self._finish(ar)

    async def republish_recent(self) -> None:
        """After a NATS reconnect: fence the requests that moved on elsewhere meanwhile (see
        ``workers.fence``), then publish the chunks of the last seconds again (RecentChunks)."""
        reconnects = self.fence.reconnects()
        recent = [(s, p, decode(p, TokenChunk)) for s, p in self._recent.since(time.monotonic())]
        running = {(r, ar.request.attempt) for r, ar in self.active.items()}
        moved = await self.fence.moved_on(running | {(c.request_id, c.attempt) for *_, c in recent})
        for rid in moved & self.active.keys():
            self._fenced.add((rid, self.active[rid].request.attempt))
            self.engine.abort(rid)
        again = [(s, p) for s, p, c in recent if c.request_id not in moved]
        for subject, payload in again:
            await self.nc.publish(subject, payload)
        self.log.info("chunks_republished", chunks=len(again), fenced=sorted(moved))
        self.fence.checked(reconnects)

    async def _finish(self, ar: ActiveRequest) -> None:
        rid = ar.request.request_id
        if self.active.get(rid) is ar:
            del self.active[rid]
        self._fenced.discard((rid, ar.request.attempt))
        self._done[(rid, ar.request.attempt)] = None
        if len(self._done) > _RECENT_DONE:
            self._done.popitem(last=False)
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
            request_id=rid,
            attempt=ar.request.attempt,
            finish_reason=ar.finish_reason,
            completion_tokens=ar.num_generated,
            cached_tokens=ar.cached_tokens,
            ms=round((time.monotonic() - ar.started_at) * 1000, 2),
        )
        if not self.active:
            self._idle.set()
            self._working.clear()
            self._finished_at = time.monotonic()
        if not self._stopping:
            self._capacity.set()
        try:
            await ar.msg.ack()
        except Exception as exc:  # the stream may have dropped it already; nothing to redo
            self.log.warning("ack_failed", request_id=rid, error=str(exc))

    # ---------------------------------------------------------------- cancels, control
    async def _on_cancel(self, cancel: CancelRequested) -> None:
        ar = self.active.get(cancel.request_id)
        if ar is not None:
            self.log.info("request_cancelled", request_id=cancel.request_id, reason=cancel.reason)
            if cancel.reason == "migrated":  # its stream moved on: not even an abort chunk
                self._fenced.add((cancel.request_id, ar.request.attempt))
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
        subject = self.subjects.ctl(prefill_worker, "kv_release")
        body = encode(kv_release(request_id))
        task = asyncio.create_task(self.nc.publish(subject, body))
        task.add_done_callback(_log_task_error)

    # ---------------------------------------------------------------- kv events, load
    def _on_kv_events(self, events: Sequence[KvCacheEvent]) -> None:
        self._kv_pending.extend(self._kv_relay.relay(events))
        if not self._kv_scheduled:
            self._kv_scheduled = True
            self._loop.call_later(self.cfg.kv_flush_interval_s, self._spawn_kv_publish)

    def _spawn_kv_publish(self) -> None:
        self._kv_scheduled = False
        events, self._kv_pending = self._kv_pending, []
        if not events:
            return
        subject = self.subjects.kv(self.cfg.model_name, self.cfg.worker_id)
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
            task.add_done_callback(_log_task_error)

    async def _in_progress_loop(self) -> None:
        """Keep long generations from being redelivered: touch every in-flight message."""
        period = max(self.cfg.ack_wait_s / 3.0, 0.5)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for ar in list(self.active.values()):
                if now - ar.started_at >= period:
                    with contextlib.suppress(Exception):
                        await ar.msg.in_progress()

    async def _load_loop(self) -> None:
        while True:
            if self._quiet():  # idle: wake for work, or to look again (status) every keepalive
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._working.wait(), self.cfg.load_keepalive_s)
            else:
                await asyncio.sleep(self.cfg.load_interval_s)
            if not self._quiet():
                await self._load_now()

    def _quiet(self) -> bool:
        """Nothing in flight for ``IDLE_SETTLE_S`` and the last report showed an empty engine:
        the report cannot have changed (only an admission, or a status change, changes an
        empty engine's load), so the tick is skipped without asking the engine (an idle process
        of 1,024 workers spent a fifth of its CPU on these ticks). Until then the engine is
        asked every interval, so what moves after the last request ends (a host tier taking
        the blocks it evicted) is reported."""
        last = self._last_load
        return (
            not self.active
            and time.monotonic() - self._finished_at >= IDLE_SETTLE_S
            and last is not None
            and _idle(last)
            and last.status == self.registry.status
        )

    async def _load_now(self) -> None:
        try:
            await self._publish_load()
        except Exception as exc:
            self.log.warning("load_publish_failed", error=str(exc))

    async def _publish_load(self, force: bool = False) -> None:
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
            and (_idle(content) or now - self._last_load_at < self.cfg.load_keepalive_s)
        ):
            return
        self._last_load, self._last_load_at = content, now
        self._reported_prefill = load.active_prefill_tokens > 0 or load.num_waiting > 0
        await self.nc.publish(
            self.subjects.metrics(self.cfg.model_name, self.cfg.role, self.cfg.worker_id),
            encode(report),
        )


def _idle(report: WorkerLoad) -> bool:
    """Nothing running, waiting or holding KV blocks."""
    return report.num_running == report.num_waiting == 0 and report.kv_usage == 0.0


def _log_task_error(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background_publish_failed", error=str(task.exception()))
