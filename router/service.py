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
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import structlog
from nats.errors import TimeoutError as NatsTimeoutError

from infra.deadletter import dead_letter
from infra.jetstream import (
    close_nats,
    connect_nats,
    connect_redis,
    ensure_consumer,
    ensure_topology,
)
from router.client import ClientConfig, FleetClient, Generation, NoWorkersError, OverloadedError
from router.discovery import Discovery
from router.fleet_state import FleetState
from router.kv.router import KvRouterConfig
from router.routers import build_router, warm_router
from schemas import (
    Request,
    RequestObservation,
    Subjects,
    TokenChunk,
    WireDecodeError,
    decode,
    encode,
)
from schemas.streams import router_consumer

log = structlog.get_logger("jetfleet.router_service")


@dataclass(frozen=True)
class RouterServiceConfig:
    nats_url: str
    subjects: Subjects = field(default_factory=Subjects)
    router: str = "kv"
    redis_url: str | None = None
    kv: KvRouterConfig = field(default_factory=KvRouterConfig)
    client: ClientConfig = field(default_factory=lambda: ClientConfig(wait_for_worker_s=5.0))
    batch: int = 64


class RouterService:
    def __init__(self, cfg: RouterServiceConfig, nc: Any, client: FleetClient) -> None:
        self.cfg = cfg
        self.nc = nc
        self.js = nc.jetstream()
        self.client = client
        self.followers: set[asyncio.Task[None]] = set()

    async def handle(self, msg: Any) -> None:
        try:
            req = decode(msg.data, Request)
        except WireDecodeError as exc:
            await dead_letter(self.nc, self.cfg.subjects, "router", msg, str(exc))
            await msg.term()
            return
        try:
            gen = await self.client.generate(req)
        except (NoWorkersError, OverloadedError) as exc:
            await self._fail(req, str(exc))
            await msg.ack()
            return
        await msg.ack()
        task = asyncio.create_task(self._follow(gen))
        self.followers.add(task)
        task.add_done_callback(self.followers.discard)

    async def _fail(self, req: Request, error: str) -> None:
        chunk = TokenChunk(req.request_id, req.attempt, 0, finish_reason="error", error=error)
        await self.nc.publish(self.cfg.subjects.tok(req.request_id), encode(chunk))

    async def _follow(self, gen: Generation) -> None:
        started = time.monotonic()
        first = 0.0
        reason: str | None = None
        error: str | None = None
        async for chunk in gen:
            if chunk.token_ids and not first:
                first = time.monotonic()
            if chunk.finish_reason is not None:
                reason, error = chunk.finish_reason, chunk.error
                if reason == "error" and chunk.worker_id == "":
                    # an error chunk made by the routing library (migration gave up): the client
                    # reads the token subject, so it must be published there
                    await self.nc.publish(self.cfg.subjects.tok(gen.request_id), encode(chunk))
        obs = RequestObservation(
            request_id=gen.request_id,
            model=gen.request.model,
            status="error" if reason == "error" else "ok",
            ts_s=time.time(),
            worker_id=gen.worker_id,
            isl_tokens=gen.prompt_len,
            osl_tokens=len(gen.generated),
            cached_tokens=gen.cached_tokens,
            ttft_s=(first - started) if first else 0.0,
            e2e_s=time.monotonic() - started,
            attempts=gen.attempts,
            finish_reason=reason,
            error=error,
            route=gen.decision,
            frontend_id="router-service",
        )
        await self.nc.publish(self.cfg.subjects.obs(gen.request.model), encode(obs))

    async def run(self, stop: asyncio.Event) -> None:
        s = self.cfg.subjects
        spec = router_consumer(s)
        await ensure_consumer(self.js, s.stream_name("REQUESTS"), spec)
        psub = await self.js.pull_subscribe_bind(spec.durable, s.stream_name("REQUESTS"))
        while not stop.is_set():
            try:
                msgs = await psub.fetch(batch=self.cfg.batch, timeout=1.0)
            except (NatsTimeoutError, TimeoutError):
                continue
            except Exception as exc:
                log.warning("router_fetch_failed", error=str(exc))
                await asyncio.sleep(0.5)
                continue
            for m in msgs:
                await self.handle(m)


async def run_router_service(cfg: RouterServiceConfig) -> None:
    nc = await connect_nats(cfg.nats_url, name="router-service")
    await ensure_topology(nc.jetstream(), cfg.subjects)
    redis = await connect_redis(cfg.redis_url) if cfg.redis_url else None
    state = FleetState()
    router = build_router(cfg.router, cfg.subjects, redis, cfg.kv)
    await warm_router(router)
    client = FleetClient(nc, cfg.subjects, state, router, cfg.client)
    discovery = Discovery(nc, cfg.subjects, state, on_worker_gone=client.worker_gone)
    await discovery.start()
    client.start()
    service = RouterService(cfg, nc, client)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("router_service_ready", router=cfg.router)
    try:
        await service.run(stop)
        with contextlib.suppress(TimeoutError):  # let followers see their requests finish
            await asyncio.wait_for(asyncio.gather(*service.followers), 30)
    finally:
        await client.stop()
        await discovery.stop()
        await close_nats(nc)
