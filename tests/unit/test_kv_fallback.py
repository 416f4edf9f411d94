"""The kv router while Redis is unreachable (``kv-fallback``): it routes on what it knows alone,
its reservations live in memory and are released there, and a request routed again through
Redis once it is back (a migration) leaves no in-memory reservation behind."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from router.fleet_state import WorkerView
from router.kv.index import InMemoryPrefixIndex
from router.kv.router import KvRouter, KvRouterConfig
from router.policies import RouteQuery
from tests.support.builders import registration


class FlakyIndex(InMemoryPrefixIndex):
    """An index that answers like Redis until it is ``down``."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    async def route(self, call):  # type: ignore[no-untyped-def]
        if self.down:
            raise RedisConnectionError("Redis unreachable: [Errno 111] Connection refused")
        return await super().route(call)

    async def release(self, request_id: str, prefill_only: bool = False) -> bool:
        if self.down:
            raise RedisConnectionError("Redis unreachable")
        return await super().release(request_id, prefill_only)


def views() -> list[WorkerView]:
    return [WorkerView(registration(w)) for w in "ab"]


def query(rid: str) -> RouteQuery:
    return RouteQuery("m", tuple(range(64)), rid, None)


async def test_routing_goes_on_in_memory_while_redis_is_away_and_nothing_leaks() -> None:
    index = FlakyIndex()
    router = KvRouter(index, KvRouterConfig(), seed=1)
    index.down = True
    decision = await router.route(query("r1"), views())
    assert decision.policy == "kv-fallback" and decision.worker_id in ("a", "b")
    assert router.fallbacks == 1 and "r1" in router._fallback_ids
    assert "r1" in router._recent.index._res  # reserved in memory
    await router.first_token("r1")  # released in memory, Redis never asked
    await router.finished("r1")
    assert "r1" not in router._fallback_ids and "r1" not in router._recent.index._res

    # routed during the outage, migrated after it: the Redis route takes over the reservation
    await router.route(query("r2"), views())
    index.down = False
    again = await router.route(query("r2"), views())
    assert again.policy == "kv"
    assert "r2" not in router._fallback_ids and "r2" not in router._recent.index._res
    assert "r2" in index._res
    await router.finished("r2")
    assert "r2" not in index._res


async def test_without_the_fallback_the_error_reaches_the_caller() -> None:
    index = FlakyIndex()
    index.down = True
    router = KvRouter(index, KvRouterConfig(redis_fallback=False), seed=1)
    with pytest.raises(RedisConnectionError):
        await router.route(query("r1"), views())
