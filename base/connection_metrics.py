"""Whether a process's NATS and Redis connections are up, as gauges on its ``/metrics``:

- ``jetfleet_nats_connected``: 1 while the NATS client says it is connected, else 0;
- ``jetfleet_redis_connected``: 1 while the last ``PING`` answered within ``ping_timeout_s``,
  else 0. Only a process that holds a Redis connection (the frontend and router service with
  the kv router, the indexer) has it, so "Redis unreachable" is never read from a process that
  does not use Redis.

Sampled every ``every_s`` (``ConnectionGauges.start``): the scrape itself runs on the operations
port's thread and cannot await a ping. In a frontend of ``--processes N`` the lowest value of
the live processes is served (``livemin``): one process cut off is a frontend cut off.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Gauge

from base.sampling import start_sampling


class _Nats(Protocol):
    @property
    def is_connected(self) -> bool: ...


class ConnectionGauges:
    def __init__(
        self,
        registry: CollectorRegistry,
        nc: _Nats,
        redis: Any | None = None,
        every_s: float = 5.0,
        ping_timeout_s: float = 2.0,
    ) -> None:
        """``redis``: a redis-py asyncio client (single, cluster or sentinel), or None."""
        self.nc = nc
        self.redis = redis
        self.every_s = every_s
        self.ping_timeout_s = ping_timeout_s
        self.nats = Gauge(
            "jetfleet_nats_connected",
            "1 while this process's NATS connection is up",
            registry=registry,
            multiprocess_mode="livemin",
        )
        self.redis_up: Gauge | None = None
        if redis is not None:
            self.redis_up = Gauge(
                "jetfleet_redis_connected",
                "1 while this process's last Redis PING answered",
                registry=registry,
                multiprocess_mode="livemin",
            )

    async def sample(self) -> None:
        self.nats.set(1 if self.nc.is_connected else 0)
        if self.redis_up is None or self.redis is None:
            return
        try:
            await asyncio.wait_for(self.redis.ping(), self.ping_timeout_s)
        except Exception:  # refused, timed out, failing over: unreachable until it answers
            self.redis_up.set(0)
        else:
            self.redis_up.set(1)

    def start(self) -> asyncio.Task[None]:
        """Sample every ``every_s`` until the task is cancelled."""
        return start_sampling(self.sample, self.every_s, "connection-gauges")
