"""The client's bookkeeping of requests in flight, without servers: one in-flight count in the
fleet state, and one way to learn that a worker left (the fleet state's removal)."""

from __future__ import annotations

from typing import Any
from unittest.mock import AsyncMock, MagicMock

from router.client import ClientConfig, FleetClient
from router.fleet_state import FleetState
from schemas import Request, RouteDecision, SamplingParams, Subjects, TokenChunk
from tests.support.builders import fleet_state, registration


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
