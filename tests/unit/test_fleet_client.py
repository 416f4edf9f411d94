"""The client's bookkeeping of requests in flight, without servers: one in-flight count in the
fleet state, and one way to learn that a worker left (the fleet state's removal)."""

from __future__ import annotations

import asyncio
from typing import Any
from unittest.mock import AsyncMock, MagicMock

import msgspec
import pytest

from router.client import ClientConfig, FleetClient, NoWorkersError, OverloadedError
from router.fleet_state import FleetState
from router.policies import LeastLoaded, LocalRouter
from schemas import (
    HeldRequests,
    Request,
    RouteDecision,
    SamplingParams,
    Subjects,
    TokenChunk,
    decode,
)
from tests.support.builders import fleet_state, registration
from tests.support.wait import wait_for


def _client(state: FleetState) -> FleetClient:
    nc: Any = MagicMock()
    nc.subscribe = AsyncMock(return_value=MagicMock(unsubscribe=AsyncMock()))
    nc.publish = AsyncMock()
    client = FleetClient(nc, Subjects("t"), state, None, ClientConfig())
    client.publish = AsyncMock()  # type: ignore[method-assign]
    return client


def _request(rid: str) -> Request:
    return Request(rid, "m", (1, 2, 3), SamplingParams(max_tokens=4))


async def test_the_fleet_state_counts_requests_in_flight_and_their_release() -> None:
    state = fleet_state(registration("w1"), registration("w2"))
    client = _client(state)
    a = await client.launch(_request("a"), routed=("s", RouteDecision("kv", "w1")))
    await client.launch(_request("b"), routed=("s", RouteDecision("kv", "w1")))
    assert [state.workers[w].in_flight for w in ("w1", "w2")] == [2, 0]
    assert state.workers["w1"].remote_prefills == 0  # an aggregated client's requests
    await a.cancel()
    await a.cancel()  # idempotent
    assert state.workers["w1"].in_flight == 1 and set(client.active) == {"b"}


async def test_a_worker_removed_from_the_fleet_state_interrupts_what_ran_there() -> None:
    state = fleet_state(registration("w1"), registration("w2"))
    client = _client(state)
    on_w1 = await client.launch(_request("a"), routed=("s", RouteDecision("kv", "w1")))
    on_w2 = await client.launch(_request("b"), routed=("s", RouteDecision("kv", "w2")))
    state.remove("w1")
    assert on_w1.pending and not on_w2.pending
    assert on_w1.stream.attempt == 0


async def test_a_worker_gone_while_the_request_was_routed_is_caught_at_registration() -> None:
    state = fleet_state(registration("w1"))
    client = _client(state)
    gen = await client.launch(_request("a"), routed=("s", RouteDecision("kv", "gone")))
    assert gen.pending  # interrupted at once, not at the stall timeout


async def test_a_stall_moves_only_where_a_migration_could_go_on() -> None:
    """Another live worker, and an attempt left: a stall moves the request. No other worker,
    or the last attempt (the migration would give up): it is waited on where it is."""
    state = fleet_state(registration("w1"), registration("w2"))
    client = _client(state)
    gen = await client.launch(_request("a"), routed=("s", RouteDecision("kv", "w1")))
    assert client._elsewhere(gen)
    gen.request = msgspec.structs.replace(gen.request, attempt=client.agg.max_attempts - 1)
    assert not client._elsewhere(gen)  # the last attempt
    gen.request = msgspec.structs.replace(gen.request, attempt=0)
    state.remove("w2")
    assert not client._elsewhere(gen)  # no other worker


async def test_a_request_is_released_before_its_caller_sees_the_final_chunk() -> None:
    """A client's next request (a conversation's next turn) must not be routed on a fleet that
    still counts the previous one: the reservation and the in-flight count go first."""
    state = fleet_state(registration("w1"))
    client = _client(state)
    gen = await client.launch(_request("a"), routed=("s", RouteDecision("kv", "w1")))
    gen.stream.feed(TokenChunk("a", 0, 0, (7,), worker_id="w1"))
    gen.stream.feed(TokenChunk("a", 0, 1, (8,), finish_reason="length", worker_id="w1"))
    seen = []
    async for chunk in gen:
        seen.append((chunk.finish_reason, state.workers["w1"].in_flight, set(client.active)))
    assert seen == [(None, 1, {"a"}), ("length", 0, set())]


def _routing_client(state: FleetState, **cfg: Any) -> tuple[FleetClient, list[int]]:
    """A client with a least-loaded router (nothing held in Redis), recording the held gauge."""
    nc: Any = MagicMock()
    nc.subscribe = AsyncMock(return_value=MagicMock(unsubscribe=AsyncMock()))
    nc.publish = AsyncMock()
    router = LocalRouter(LeastLoaded(seed=1))
    client = FleetClient(nc, Subjects("t"), state, router, ClientConfig(**cfg))
    client.publish = AsyncMock()  # type: ignore[method-assign]
    gauge: list[int] = []
    client.holding.on_held = gauge.append
    return client, gauge


async def test_requests_wait_here_while_every_worker_has_a_queue_and_go_as_room_comes() -> None:
    state = fleet_state(registration("w1", max_num_seqs=1))
    client, gauge = _routing_client(state, hold_waiting_per_worker=1)
    first = await client.generate(_request("a"))  # the slot
    await client.generate(_request("b"))  # waits on w1 for the slot
    held = [asyncio.create_task(client.generate(_request(r))) for r in ("c", "d", "e")]
    await wait_for(lambda: client.held_requests == 3, timeout=2)
    assert not any(t.done() for t in held) and gauge[-1] == 3
    # the client of one leaves: it is forgotten, the others keep their places
    held[2].cancel()
    await asyncio.gather(held[2], return_exceptions=True)
    assert client.held_requests == 2 and gauge[-1] == 2
    # one finishes: one goes at once, in arrival order
    await first.cancel()
    await wait_for(lambda: held[0].done(), timeout=2)
    assert not held[1].done() and held[0].result().worker_id == "w1"
    # a worker joins: the last one goes to it
    state.upsert(registration("w2", max_num_seqs=4))
    gen = await asyncio.wait_for(held[1], 2)
    assert gen.worker_id == "w2" and client.held_requests == 0 and gauge[-1] == 0
    assert not client.holding.queue.pending and not client.holding.let_go  # each let go was counted
    await client.stop()


async def test_the_held_count_toward_shedding() -> None:
    state = fleet_state(registration("w1", max_num_seqs=1))
    client, _ = _routing_client(state, hold_waiting_per_worker=1, max_waiting_per_worker=3)
    for rid in ("a", "b"):
        await client.generate(_request(rid))  # the slot and one waiting
    held = [asyncio.create_task(client.generate(_request(r))) for r in ("c", "d")]
    await wait_for(lambda: client.held_requests == 2, timeout=2)  # 1 + 3 = 4 accepted
    with pytest.raises(OverloadedError):
        await client.generate(_request("e"))
    for t in held:
        t.cancel()
    await asyncio.gather(*held, return_exceptions=True)
    await client.stop()


async def test_holding_off_sends_every_request_to_wait_on_a_worker() -> None:
    state = fleet_state(registration("w1", max_num_seqs=1))
    client, _ = _routing_client(state, hold_waiting_per_worker=0)
    for rid in "abcde":
        await asyncio.wait_for(client.generate(_request(rid)), 2)
    assert state.workers["w1"].in_flight == 5 and client.held_requests == 0


async def test_held_requests_of_a_fleet_that_left_end_as_new_ones_do() -> None:
    state = fleet_state(registration("w1", max_num_seqs=1))
    client, _ = _routing_client(state, hold_waiting_per_worker=1, wait_for_worker_s=0.2)
    for rid in ("a", "b"):
        await client.generate(_request(rid))
    held = asyncio.create_task(client.generate(_request("c")))
    await wait_for(lambda: client.held_requests == 1, timeout=2)
    state.remove("w1")  # the last worker leaves
    with pytest.raises(NoWorkersError):
        await asyncio.wait_for(held, 2)
    assert client.held_requests == 0
    await client.stop()


async def test_a_request_let_go_skips_the_workers_whose_queue_is_full() -> None:
    """The room that let it go is another worker's: the router does not get to send it to a full
    queue (a kv router could, for its cached prefix)."""
    state = fleet_state(registration("w1", max_num_seqs=1))
    client, _ = _routing_client(state, hold_waiting_per_worker=1)
    for rid in ("a", "b"):
        await client.generate(_request(rid))
    held = asyncio.create_task(client.generate(_request("c")))
    await wait_for(lambda: client.held_requests == 1, timeout=2)
    state.upsert(registration("w2", max_num_seqs=1))
    state.workers["w2"].in_flight = 1  # its one slot taken (by another route): room for 1 more
    routed: list[tuple[str, ...]] = []
    real_route = client.router.route  # type: ignore[union-attr]

    async def spy(query: Any, cands: Any) -> Any:
        routed.append(tuple(v.worker_id for v in cands))
        return await real_route(query, cands)

    client.router.route = spy  # type: ignore[union-attr,method-assign]
    gen = await asyncio.wait_for(held, 2)
    assert routed == [("w2",)] and gen.worker_id == "w2"
    assert not client.holding.queue.pending and not client.holding.let_go
    await client.stop()


async def test_a_frontend_says_how_many_it_holds_and_when_it_holds_none() -> None:
    """For the planner: held requests are in no worker's load report."""
    state = fleet_state(registration("w1", max_num_seqs=1))
    client, _ = _routing_client(state, hold_waiting_per_worker=1)
    client.holding.reporter = "f1"
    for rid in ("a", "b"):
        await client.generate(_request(rid))
    held = [asyncio.create_task(client.generate(_request(r))) for r in ("c", "d")]
    subject = Subjects("t").held("m", "f1")

    def reports() -> list[HeldRequests]:
        calls = client.nc.publish.call_args_list  # type: ignore[attr-defined]
        return [decode(c.args[1], HeldRequests) for c in calls if c.args[0] == subject]

    await wait_for(lambda: any(r.held == {"agg": 2} for r in reports()), timeout=2)
    assert {(r.frontend_id, r.model) for r in reports()} == {("f1", "m")}
    for t in held:
        t.cancel()
    await asyncio.gather(*held, return_exceptions=True)
    await wait_for(lambda: reports()[-1].held == {}, timeout=2)  # and once more: none
    await client.stop()
