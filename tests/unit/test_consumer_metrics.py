"""A durable consumer's backlog as a gauge: its num_pending, by stream and consumer."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from base.consumer_metrics import ConsumerPending


@dataclass
class Info:
    num_pending: int | None


class FakeJs:
    def __init__(self) -> None:
        self.pending: int | None = 0
        self.asked: list[tuple[str, str]] = []

    async def consumer_info(self, stream: str, durable: str) -> Info:
        self.asked.append((stream, durable))
        if self.pending is None:
            raise ConnectionError("nats away")
        return Info(self.pending)


async def test_the_gauge_is_the_consumers_num_pending_and_a_failed_read_keeps_it() -> None:
    registry = CollectorRegistry()
    js = FakeJs()
    pending = ConsumerPending(registry, js, "T_REQUESTS", "router")
    labels = {"stream": "T_REQUESTS", "consumer": "router"}
    js.pending = 42
    await pending.sample()
    assert js.asked == [("T_REQUESTS", "router")]
    assert registry.get_sample_value("jetfleet_consumer_pending_messages", labels) == 42
    js.pending = None
    with pytest.raises(ConnectionError):
        await pending.sample()
    assert registry.get_sample_value("jetfleet_consumer_pending_messages", labels) == 42
