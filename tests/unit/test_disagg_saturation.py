"""The prefill pool's queue, as the client feeds it to the saturation rule: remote prefills
in flight (or requests a worker reports waiting), never the whole requests a prefill worker
decodes since short traffic may run there (``local_on_prefill_workers``)."""

from __future__ import annotations

from typing import Any
from unittest.mock import MagicMock

from router.client import FleetClient
from router.fleet_state import FleetState
from schemas import Request, SamplingParams, Subjects, WorkerLoad
from tests.support.builders import registration

LONG = Request("r", "m", tuple(range(3000)), SamplingParams(max_tokens=4))


def _load(wid: str, running: int, waiting: int) -> WorkerLoad:
    return WorkerLoad(wid, "m", "prefill", 0.0, running, waiting, 64, 0.0, 100)


def _client(loads: dict[str, tuple[int, int]]) -> FleetClient:
    state = FleetState()
    for wid in loads:
        state.upsert(registration(wid, role="prefill", max_num_seqs=64))
        state.apply_load(_load(wid, *loads[wid]), 0.0)
    state.upsert(registration("d", role="decode", max_num_seqs=64))
    nc: Any = MagicMock()
    return FleetClient(nc, Subjects("t"), state, None)


def _prefills(c: FleetClient, worker_id: str, n: int) -> None:
    """``n`` remote prefills in flight on ``worker_id``, as the client counts them."""
    for _ in range(n):
        c.moved("", worker_id, c.prefill)


def test_whole_requests_decoding_on_prefill_workers_do_not_saturate_the_pool() -> None:
    c = _client({"p1": (9, 0), "p2": (12, 0)})  # busy decoding short requests, none waiting
    assert c._plan(LONG, None).reason == "long_uncached"


def test_remote_prefills_in_flight_saturate_it() -> None:
    c = _client({"p1": (9, 0), "p2": (0, 0)})
    _prefills(c, "p1", 4)
    assert c._plan(LONG, None).reason == "long_uncached"  # p2 is free
    _prefills(c, "p2", 4)
    assert c._plan(LONG, None).reason == "prefill_saturated"


def test_requests_waiting_on_the_workers_saturate_it() -> None:
    """Other frontends' prefills show as the workers' waiting queues."""
    c = _client({"p1": (2, 4), "p2": (1, 5)})
    assert c._plan(LONG, None).reason == "prefill_saturated"


async def test_a_generate_cancelled_while_publishing_leaves_nothing_behind() -> None:
    """A caller cancelled mid-publish (a client gone, a deadline): no active entry, no in-flight
    count on the worker, no token subscription (they would inflate the pools' queues)."""
    import asyncio
    from unittest.mock import AsyncMock

    import pytest

    from schemas import RouteDecision

    c = _client({"p1": (0, 0)})
    sub = MagicMock()
    sub.unsubscribe = AsyncMock()
    c.nc.subscribe = AsyncMock(return_value=sub)
    c.publish = AsyncMock(side_effect=asyncio.CancelledError())  # type: ignore[method-assign]
    decision = RouteDecision("kv", "d")
    with pytest.raises(asyncio.CancelledError):
        await c.launch(LONG, routed=("t.req.m.w.d", decision), leg=c.decode)
    assert c.active == {}
    assert c.state.workers["d"].in_flight == 0
    sub.unsubscribe.assert_awaited()
