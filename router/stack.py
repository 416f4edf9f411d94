"""The routing stack a frontend and the router service share, built in one place: NATS (with the
fleet's topology), Redis when the router needs it, the fleet state, the router, the client and
the discovery that feeds them. ``close`` takes it down in reverse, Redis included."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from nats.aio.client import Client as NATS

from base.connect import Hook, close_nats, connect_nats, connect_redis
from base.topology import ensure_topology
from router.client import ClientConfig, FleetClient
from router.disagg import DisaggConfig, Placement
from router.discovery import Discovery
from router.fleet_state import FleetState
from router.kv.router import KvRouterConfig
from router.policies import Router
from router.routers import build_router, warm_router
from schemas import Subjects


@dataclass(frozen=True)
class StackConfig:
    """The routing stack of a frontend or a router service (their configs hold one)."""

    nats_url: str
    subjects: Subjects = field(default_factory=Subjects)
    router: str = "kv"  # a policy name (router/policies.py, router/kv/router.py)
    redis_url: str | None = None  # the kv router's prefix index and reservations
    kv: KvRouterConfig = field(default_factory=KvRouterConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    disagg: DisaggConfig = field(default_factory=DisaggConfig)

    @property
    def routes_only_with_redis(self) -> bool:
        """Routing cannot go on without Redis (``kv`` with no fallback): readiness needs it."""
        return self.router == "kv" and not self.kv.redis_fallback


@dataclass
class RoutingStack:
    nc: NATS
    redis: aioredis.Redis | None
    state: FleetState
    router: Router | None
    client: FleetClient
    discovery: Discovery

    @classmethod
    async def open(
        cls,
        cfg: StackConfig,
        name: str,
        on_placement: Callable[[str, Placement], None] = lambda _model, _p: None,
        on_worker_change: Callable[[str, str], None] = lambda _worker_id, _change: None,
    ) -> RoutingStack:
        """Connect and start; anything opened before a failure is closed again.
        ``on_placement(model, placement)``: each disaggregated model's prefill placement;
        ``on_worker_change(worker_id, "joined" | "left")``: discovery's changes of workers."""
        hooks: list[Hook] = []
        nc = await connect_nats(cfg.nats_url, name=name, on_reconnect=hooks)
        redis: aioredis.Redis | None = None
        try:
            await ensure_topology(nc.jetstream(), cfg.subjects)
            redis = await connect_redis(cfg.redis_url) if cfg.redis_url else None
            state = FleetState()
            router = build_router(cfg.router, cfg.subjects, redis, cfg.kv)
            await warm_router(router)
            client = build_client(nc, cfg, state, router, on_placement)
            discovery = Discovery(
                nc,
                cfg.subjects,
                state,
                on_worker_joined=lambda w: on_worker_change(w, "joined"),
                on_worker_left=lambda w: on_worker_change(w, "left"),
            )
            await discovery.start()
        except BaseException:
            if redis is not None:
                await redis.aclose()
            await close_nats(nc)
            raise
        client.start()
        hooks.append(client.catch_up)  # chunks published while this process was away
        return cls(nc, redis, state, router, client, discovery)

    async def close(self) -> None:
        await self.client.stop()
        await self.discovery.stop()
        await close_nats(self.nc)
        if self.redis is not None:
            await self.redis.aclose()


def build_client(
    nc: NATS,
    cfg: StackConfig,
    state: FleetState,
    router: Router | None,
    on_placement: Callable[[str, Placement], None] = lambda _model, _p: None,
) -> FleetClient:
    """The one client over the fleet state and router: aggregated workers, and the prefill and
    decode pools of disaggregated models (``router/client.py``)."""
    return FleetClient(
        nc, cfg.subjects, state, router, cfg.client, cfg.disagg, on_placement=on_placement
    )
