"""The connection gauges: NATS from the client's flag, Redis from a PING that answers in time."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from base.connection_metrics import ConnectionGauges


class FakeNats:
    is_connected = True


class FakeRedis:
    def __init__(self) -> None:
        self.answer: BaseException | None = None
        self.hang = False

    async def ping(self) -> bool:
        if self.hang:
            await asyncio.Event().wait()
        if self.answer is not None:
            raise self.answer
        return True


def value(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(name)


async def test_nats_follows_the_clients_flag_and_redis_is_absent_without_redis() -> None:
    registry = CollectorRegistry()
    nc = FakeNats()
    gauges = ConnectionGauges(registry, nc)
    await gauges.sample()
    assert value(registry, "jetfleet_nats_connected") == 1
    nc.is_connected = False
    await gauges.sample()
    assert value(registry, "jetfleet_nats_connected") == 0
    assert value(registry, "jetfleet_redis_connected") is None


async def test_redis_is_up_while_ping_answers_and_down_on_error_or_timeout() -> None:
    registry = CollectorRegistry()
    redis = FakeRedis()
    gauges = ConnectionGauges(registry, FakeNats(), redis, ping_timeout_s=0.01)
    await gauges.sample()
    assert value(registry, "jetfleet_redis_connected") == 1
    redis.answer = ConnectionError("refused")
    await gauges.sample()
    assert value(registry, "jetfleet_redis_connected") == 0
    redis.answer = None
    await gauges.sample()
    assert value(registry, "jetfleet_redis_connected") == 1
    redis.hang = True
    await gauges.sample()
    assert value(registry, "jetfleet_redis_connected") == 0
