"""A worker's intake: the request messages it takes, from its own subject and its pool.

Requests arrive on the worker's own subject (a durable JetStream push consumer named
``own_{worker_id}``, manual ack, flow control; the worker deletes any predecessor's at start and
its own when it drains; after a crash the server removes it 60 s after its subscriber left) and
on its pool subject (a shared durable pull consumer, pulled only while there is capacity, by the
one pull loop of its process: ``workers.pool``). A message that cannot be decoded, a request the
worker refuses (``schemas.validate``) or one for another model is dead-lettered or terminated,
never redelivered to spread. A redelivery of what runs changes nothing; of what finished, it is
acked. A message delivered late (redelivered, or older than the registration TTL) is checked
against the fence first: the routers may have moved it on (``workers.fence``). The message is
kept in progress while it generates and acked when it ends (by the runtime).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import NotFoundError

from base.consume import DeadLetters
from base.tracing import Tracing
from model.detokenize import IncrementalDetokenizer
from schemas import Request
from schemas.trace import HEADER as TRACE_HEADER
from schemas.trace import parse_traceparent
from schemas.validate import request_problem
from workers.config import WorkerConfig
from workers.engine import Engine, EngineRequest
from workers.feeds import ProcessFeeds
from workers.fence import Fence
from workers.in_flight import InFlight
from workers.metrics import WorkerMetrics
from workers.request_state import ActiveRequest


def own_consumer(worker_id: str) -> str:
    """The durable consumer of a worker's own request subject (a valid consumer name)."""
    return "own_" + re.sub(r"[^A-Za-z0-9_-]", "_", worker_id)


class Intake:
    def __init__(
        self,
        cfg: WorkerConfig,
        nc: NATS,
        engine: Engine,
        feeds: ProcessFeeds,
        fence: Fence,
        flight: InFlight,
        tokenizer: Any,
        metrics: WorkerMetrics,
        tracing: Tracing,
        on_ready: Callable[[ActiveRequest, bool], None],
        log: Any,
    ) -> None:
        self.cfg = cfg
        self.js = nc.jetstream()
        self.engine = engine
        self.feeds = feeds
        self.fence = fence
        self.flight = flight
        self.tokenizer = tokenizer
        eos = tokenizer.eos_token
        special = tokenizer.special_tokens
        self._eos_ids = frozenset([special[eos]] if eos in special else [])
        self.metrics = metrics
        self.tracing = tracing
        self.on_ready = on_ready
        self.letters = DeadLetters(nc, cfg.subjects, "worker", metrics.dead_letters)
        self.log = log

    async def subscribe(self) -> Any:
        """The worker's own consumer, made anew (a predecessor's is deleted first)."""
        s, cfg = self.cfg.subjects, self.cfg
        # A durable consumer (named for this worker, removed by the server 60 s after its last
        # subscriber left) inherits the stream's replicas: on a NATS cluster it survives the
        # loss of a node, where an ephemeral one (R1) would vanish with it and leave requests
        # routed to this worker unseen until the frontends' stall timeout.
        # A process restarted under the same id (a pod) must not inherit its predecessor's
        # consumer: the requests that one held unacked are migrated by the frontends, and a
        # redelivery here would generate them twice (or splice two runs into one answer).
        with contextlib.suppress(NotFoundError):
            await self.js.delete_consumer(s.stream_name("REQUESTS"), own_consumer(cfg.worker_id))
        return await self.js.subscribe(
            s.req_worker(cfg.model_name, cfg.worker_id),
            durable=own_consumer(cfg.worker_id),
            cb=self.on_message,
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

    def tasks(self) -> list[asyncio.Task[Any]]:
        return [
            asyncio.create_task(
                self.feeds.pool.serve(self.free_slots, self.on_message), name="pool"
            ),
            asyncio.create_task(self._in_progress_loop(), name="in-progress"),
        ]

    async def delete_consumer(self) -> None:
        """Gone for good (after a crash: the server's inactivity timeout does it)."""
        with contextlib.suppress(Exception):
            await self.js.delete_consumer(
                self.cfg.subjects.stream_name("REQUESTS"), own_consumer(self.cfg.worker_id)
            )

    def free_slots(self) -> int:
        """Requests the engine has room for: what the pool feed may hand this worker."""
        return self.flight.free_slots(self.engine.max_num_seqs)

    async def on_message(self, msg: Msg) -> None:
        """Take one request message; whatever goes wrong with it stays with it (the consumer
        goes on, the message is terminated rather than redelivered to spread)."""
        try:
            await self._take(msg)
        except Exception as exc:
            self.log.error("request_failed_to_start", error=repr(exc))
            await self.letters.refuse(msg, f"worker error: {exc!r}")

    async def _take(self, msg: Msg) -> None:
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
        current = self.flight.active.get(req.request_id)
        if current is not None and current.request.attempt >= req.attempt:
            return  # redelivery of what is running: keep it in progress, ack at the end
        if key in self.flight.done:
            await msg.ack()  # redelivery of what finished: idempotent
            return
        if req.model != self.cfg.model_name:
            await self.letters.refuse(msg, f"wrong model {req.model!r}")
            return
        if self._late(msg) and await self.fence.moved_on({key}):
            self.log.info("request_fenced", request_id=req.request_id, attempt=req.attempt)
            self.flight.done[key] = None  # delivered after routers moved it on: not run at all
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
        ar = ActiveRequest(req, msg, self.cfg.worker_id, detok, self.on_ready, time.monotonic())
        self.flight.started(ar, self.engine.max_num_seqs)
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

    async def _in_progress_loop(self) -> None:
        """Keep long generations from being redelivered: touch every in-flight message."""
        period = max(self.cfg.ack_wait_s / 3.0, 0.5)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for ar in list(self.flight.active.values()):
                if now - ar.started_at >= period:
                    with contextlib.suppress(Exception):
                        await ar.msg.in_progress()
