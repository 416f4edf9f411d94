"""How far a durable JetStream consumer is behind its stream, as a gauge on ``/metrics``:
``jetfleet_consumer_pending_messages{stream, consumer}``, the consumer's ``num_pending`` (messages
of its filter not yet delivered to anyone), read from its consumer info every ``every_s``.

The process that pulls from a shared consumer reports it (the planner its ``planner_{model}``,
the router service the ``router`` submissions, a worker process its pool's); every replica reports
the same number, so alerts take the highest. A failed read (NATS away) leaves the last value:
the connection gauges say NATS is away.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from base.sampling import start_sampling


class ConsumerPending:
    def __init__(
        self, registry: CollectorRegistry, js: Any, stream: str, durable: str, every_s: float = 5.0
    ) -> None:
        """``js``: a nats-py JetStreamContext."""
        self.js = js
        self.stream = stream
        self.durable = durable
        self.every_s = every_s
        self.pending = Gauge(
            "jetfleet_consumer_pending_messages",
            "Messages of a durable consumer's subjects not yet delivered (its num_pending)",
            ["stream", "consumer"],
            registry=registry,
        ).labels(stream, durable)

    async def sample(self) -> None:
        info = await self.js.consumer_info(self.stream, self.durable)
        self.pending.set(info.num_pending or 0)

    def start(self) -> asyncio.Task[None]:
        """Sample every ``every_s`` until the task is cancelled."""
        return start_sampling(self.sample, self.every_s, f"pending-{self.durable}")
