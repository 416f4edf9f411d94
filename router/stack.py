"""The routing stack a frontend and the router service share, built in one place: NATS (with the
fleet's topology), Redis when the router needs it, the fleet state, the router, the client and
the discovery that feeds them. ``close`` takes it down in reverse, Redis included."""

from __future__ import annotations

from dataclasses import dataclass, replace

import redis.asyncio as aioredis
from nats.aio.client import Client as NATS

from base.connect import Hook, close_nats, connect_nats, connect_redis
from base.topology import ensure_topology
from router.client import ClientConfig, FleetClient
from router.disagg import DisaggConfig
from router.disagg_client import DisaggClient
from router.discovery import Discovery
from router.fleet_state import FleetState
from router.kv.router import KvRouterConfig
from router.policies import Router
from router.routers import build_router, warm_router
from schemas import Subjects


@dataclass(frozen=True)
class StackConfig:
    nats_url: str
    subjects: Subjects
    router: str = "kv"
    redis_url: str | None = None
    kv: KvRouterConfig | None = None
    client: ClientConfig | None = None
    disagg: DisaggConfig | None = None


@dataclass
class RoutingStack:
    nc: NATS
    redis: aioredis.Redis | None
    state: FleetState
    router: Router | None
    client: DisaggClient
    discovery: Discovery

    @classmethod
    async def open(cls, cfg: StackConfig, name: str) -> RoutingStack:
        """Connect and start; anything opened before a failure is closed again."""
        hooks: list[Hook] = []
        nc = await connect_nats(cfg.nats_url, name=name, on_reconnect=hooks)
        redis: aioredis.Redis | None = None
        try:
            await ensure_topology(nc.jetstream(), cfg.subjects)
            redis = await connect_redis(cfg.redis_url) if cfg.redis_url else None
            state = FleetState()
            router = build_router(cfg.router, cfg.subjects, redis, cfg.kv)
            await warm_router(router)
            client = build_client(nc, cfg, state, router)
            discovery = Discovery(nc, cfg.subjects, state, on_worker_gone=client.worker_gone)
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
    nc: NATS, cfg: StackConfig, state: FleetState, router: Router | None
) -> DisaggClient:
    """One client per role over the same fleet state and router: aggregated workers, and the
    prefill and decode pools of disaggregated models (``router/disagg_client.py``)."""
    base = cfg.client or ClientConfig()
    disagg = cfg.disagg or DisaggConfig()

    def client(role_cfg: ClientConfig) -> FleetClient:
        return FleetClient(nc, cfg.subjects, state, router, role_cfg)

    # a prefill is not migrated: a stalled or lost one is prefilled on the decode worker instead
    prefill = replace(
        base, role="prefill", max_attempts=1, stall_timeout_s=disagg.prefill_timeout_s
    )
    decode = replace(base, role="decode")
    # over both pools only with a router: a pool (no router) is one subject per role
    either = client(replace(decode, also_roles=("prefill",))) if router is not None else None
    return DisaggClient(
        client(replace(base, role="agg")),
        client(prefill),
        client(decode),
        disagg,
        either,
    )
