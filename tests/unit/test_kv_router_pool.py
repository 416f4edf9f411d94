"""The loads a kv route scores: read again in the background while routes keep coming, read on
the route's path after a pause (a route must not go on with the loads of before it)."""

from __future__ import annotations

import pytest

from router.fleet_state import WorkerView
from router.kv import router as kv_router
from router.kv.index import InMemoryPrefixIndex
from router.kv.router import POOL_STALE_ROUNDS, KvRouter, KvRouterConfig
from router.policies import RouteQuery
from schemas import WorkerLoad
from tests.support.builders import registration


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def load(worker: str, decode_blocks: int) -> WorkerLoad:
    return WorkerLoad(
        worker, "m", "agg", 0.0, 1 if decode_blocks else 0, 0, 8, 0.5, 1000,
        active_decode_blocks=decode_blocks,
    )  # fmt: skip


def loaded(views: list[WorkerView], clock: Clock, busy: str) -> None:
    for v in views:
        v.load = load(v.worker_id, 800 if v.worker_id == busy else 0)
        v.load_at = clock.now


async def test_a_route_after_a_pause_reads_the_loads_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    monkeypatch.setattr(kv_router.time, "monotonic", clock)
    cfg = KvRouterConfig(temperature=0, pool_refresh_s=0.25)
    router = KvRouter(InMemoryPrefixIndex(), cfg, seed=1)
    views = [WorkerView(registration(w)) for w in "ab"]  # one list: one cached pool

    async def route(rid: str) -> str:
        decision = await router.route(RouteQuery("m", tuple(range(64)), rid, None), views)
        await router.finished(rid)
        return decision.worker_id

    loaded(views, clock, busy="a")
    assert await route("r1") == "b"  # a new pool: its loads read now
    loaded(views, clock, busy="b")
    clock.now += 0.1
    assert await route("r2") == "b"  # within a refresh period: the pool as it was
    clock.now += POOL_STALE_ROUNDS * cfg.pool_refresh_s
    loaded(views, clock, busy="b")
    assert await route("r3") == "a"  # after a pause: read before the route
