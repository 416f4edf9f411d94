"""The router service: routes requests that NATS clients publish on fleet.submit.{model}.

Replicas share one durable pull consumer, so each submitted request is routed once. A request is
acked after it has been forwarded (the forward carries ``Nats-Msg-Id = {id}:{attempt}``, so a
redelivery after a crash is absorbed by JetStream's dedupe window). The service then follows the
request's token stream like a frontend does, to release its load count and migrate the request if
its worker dies; the client reads the same token subject directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry, Counter

from base.connection_metrics import ConnectionGauges
from base.consume import DeadLetters, pull_loop, until
from base.consumer_metrics import ConsumerPending
from base.deadletter import DeadLetterMetrics
from base.ops_http import nats_connected
from base.ops_presence import serve_ops
from base.signals import stop_event
from base.topology import ensure_consumer
from base.tracing import Span, Tracing
from router.client import FleetClient
from router.generation import Generation, NoWorkersError, OverloadedError
from router.observation import observation
from router.stack import RoutingStack, StackConfig
from schemas import Request, TokenChunk, encode
from schemas.streams import router_consumer
from schemas.tokens import error_chunk
from schemas.trace import HEADER as TRACE_HEADER
from schemas.validate import request_problem

log = structlog.get_logger("jetfleet.router_service")


@dataclass(frozen=True)
class RouterServiceConfig:
    stack: StackConfig
    batch: int = 64
    metrics_port: int = 0  # the operations port: /metrics, /health, /ready (0: off)
    metrics_host: str = "127.0.0.1"


def submissions_counter(registry: CollectorRegistry) -> Counter:
    """The router service's metric (on its operations port)."""
    return Counter(
        "jetfleet_router_submissions",
        "Submissions by outcome: routed, invalid, undecodable, no_workers, routing_failed",
        ["outcome"],
        registry=registry,
    )


def made_here(chunk: TokenChunk) -> bool:
    """A final chunk the routing library made, not a worker: a migration that gave up (error),
    or one that found the budget already spent (length). The client reads the token subject and
    waits for a final chunk, so it must be published there."""
    return chunk.finish_reason is not None and chunk.worker_id == ""


class RouterService:
    def __init__(
        self,
        cfg: RouterServiceConfig,
        nc: NATS,
        client: FleetClient,
        vocab_size: Callable[[str], int | None] = lambda _model: None,
        registry: CollectorRegistry | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.cfg = cfg
        self.subjects = cfg.stack.subjects
        self.tracing = tracing or Tracing("jetfleet-router", "router-service", env={})
        registry = registry or CollectorRegistry()
        self.submissions = submissions_counter(registry)
        self.vocab_size = vocab_size  # the model's, once discovery has loaded its tokenizer
        self.nc = nc
        self.js = nc.jetstream()
        self.letters = DeadLetters(nc, self.subjects, "router", DeadLetterMetrics(registry))
        self.client = client
        self.followers: set[asyncio.Task[None]] = set()

    async def handle(self, msg: Msg) -> None:
        """Route one submission; a bad one is terminated and dead-lettered (its client, when it
        can be told, gets an error chunk) and never stops the service."""
        req = await self.letters.decoded(msg, Request)
        if req is None:
            self.submissions.labels("undecodable").inc()
            return
        problem = request_problem(req, self.vocab_size(req.model))
        if problem is not None:
            self.submissions.labels("invalid").inc()
            await self.letters.refuse_request(msg, req, problem)
            return
        # a NATS client's W3C trace context continues through the routed request to the worker
        parent = (msg.headers or {}).get(TRACE_HEADER)
        span = self.tracing.start(
            f"route {req.model}",
            parent,
            "consumer",
            {"jetfleet.request_id": req.request_id, "gen_ai.request.model": req.model},
        )
        try:
            gen = await self.client.generate(req, span.traceparent or None)
        except (NoWorkersError, OverloadedError) as exc:
            span.end({"jetfleet.outcome": "no_workers"}, error=str(exc))
            self.submissions.labels("no_workers").inc()
            await self._fail(req, str(exc))
            await msg.ack()
            return
        except Exception as exc:  # routing backend down: the client hears it, the loop goes on
            self.submissions.labels("routing_failed").inc()
            log.error("routing_failed", request_id=req.request_id, error=repr(exc))
            await self._fail(req, f"routing failed: {exc}")
            span.end({"jetfleet.outcome": "routing_failed"}, error=str(exc))
            await msg.ack()
            return
        self.submissions.labels("routed").inc()
        await msg.ack()
        task = asyncio.create_task(self._follow(gen, span))
        self.followers.add(task)
        task.add_done_callback(self.followers.discard)

    async def _fail(self, req: Request, error: str) -> None:
        chunk = error_chunk(req.request_id, req.attempt, 0, error)
        await self.nc.publish(self.subjects.tok(req.request_id), encode(chunk))

    async def _follow(self, gen: Generation, span: Span) -> None:
        started = time.monotonic()
        first = 0.0
        reason: str | None = None
        error: str | None = None
        last = 0.0
        async for chunk in gen:
            if chunk.token_ids:
                last = time.monotonic()
                first = first or last
            if chunk.finish_reason is not None:
                reason, error = chunk.finish_reason, chunk.error
                if made_here(chunk):
                    await self.nc.publish(self.subjects.tok(gen.request_id), encode(chunk))
        obs = observation(
            gen,
            status="error" if reason == "error" else "ok",
            accepted=started,
            first_at=first,
            last_at=last,
            source="router-service",
            finish_reason=reason,
            error=error,
        )
        span.end(
            {
                "jetfleet.worker_id": obs.worker_id,
                "gen_ai.usage.output_tokens": obs.osl_tokens,
                "gen_ai.response.finish_reasons": reason,
            },
            error=error if reason == "error" else None,
        )
        await self.nc.publish(self.subjects.obs(gen.request.model), encode(obs))

    async def run(self, stop: asyncio.Event) -> None:
        s = self.subjects
        spec = router_consumer(s)
        await ensure_consumer(self.js, s.stream_name("REQUESTS"), spec)
        psub = await self.js.pull_subscribe_bind(spec.durable, s.stream_name("REQUESTS"))
        await pull_loop(psub, until(stop, self.cfg.batch), self.handle, log)


async def run_router_service(cfg: RouterServiceConfig) -> None:
    tracing = Tracing("jetfleet-router", f"router-{os.getpid()}")  # OTLP export if configured
    stack = await RoutingStack.open(cfg.stack, name="router-service")
    stack.client.holding.reporter = f"router-{os.getpid()}"

    def vocab_size(model: str) -> int | None:
        served = stack.discovery.models.get(model)
        return None if served is None else served.tokenizer.vocab_size

    registry = CollectorRegistry()
    service = RouterService(cfg, stack.nc, stack.client, vocab_size, registry, tracing)
    presence = await serve_ops(
        stack.nc,
        cfg.stack.subjects,
        "router",
        cfg.metrics_port,
        registry,
        nats_connected(stack.nc),
        cfg.metrics_host,
    )
    connections = ConnectionGauges(registry, stack.nc, stack.redis).start()
    s = cfg.stack.subjects
    backlog = ConsumerPending(
        registry, stack.nc.jetstream(), s.stream_name("REQUESTS"), router_consumer(s).durable
    ).start()
    stop = stop_event()
    log.info("router_service_ready", router=cfg.stack.router)
    try:
        await service.run(stop)
        with contextlib.suppress(TimeoutError):  # let followers see their requests finish
            await asyncio.wait_for(asyncio.gather(*service.followers), 30)
    finally:
        if presence is not None:
            await presence.stop()
        connections.cancel()
        backlog.cancel()
        await stack.close()
        tracing.shutdown()
