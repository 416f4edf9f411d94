"""The prefix index contract: one suite, run unchanged against every implementation.

A backend test module subclasses ``IndexContract`` and provides an ``index`` fixture. Events go
through a worker's ``KvRelay`` (as a mocker's do: fleet hashes) and ``ops_of``, as in the fleet.
"""

from __future__ import annotations

from typing import Any

import pytest

from router.kv.routing import RouteCall, WorkerPool
from router.kv.translate import ops_of
from schemas.hashing import block_hashes
from schemas.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEventBatch
from workers.kv_relay import KvRelay

BS = 4
M = "m"


def tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


class Feeder:
    """Feeds a worker's events through its relay into an index, numbering batches and stream
    seqs."""

    def __init__(self, index: Any) -> None:
        self.index = index
        self.relays: dict[str, KvRelay] = {}
        self.event_ids: dict[str, int] = {}
        self.seq = 0

    async def send(self, worker: str, *events, event_id: int | None = None, seq: int | None = None):
        eid = event_id if event_id is not None else self.event_ids.get(worker, 0) + 1
        self.event_ids[worker] = eid
        self.seq = seq if seq is not None else self.seq + 1
        relay = self.relays.setdefault(worker, KvRelay(True, 4))
        batch = KvEventBatch(worker, M, eid, 0.0, tuple(relay.relay(events)))
        return await self.index.apply(M, worker, eid, self.seq, ops_of(batch))

    async def store(self, worker: str, toks: list[int], parent=None):
        hashes = tuple(block_hashes(toks, BS, parent=parent))
        return await self.send(worker, BlockStored(hashes, parent, tuple(toks), BS))


def pool(*workers: str, **reported: tuple[float, float]) -> WorkerPool:
    return WorkerPool(tuple(workers), dict(reported))


def call(rid: str, h, new_blocks: int, p: WorkerPool, sampled=None, **kw) -> RouteCall:
    """A route over pool ``p``, scoring ``sampled`` (all of the pool by default)."""
    scored = p.workers if sampled is None else sampled
    return RouteCall(M, rid, tuple(h), new_blocks, p, scored, **kw)


async def ready(index: Any) -> None:
    """A router reads the slot table before it can find holders outside its sample."""
    load = getattr(index, "load_table", None)
    if load is not None:
        await load(M)


class IndexContract:
    async def test_match_counts_leading_blocks_per_worker(self, index):
        f = Feeder(index)
        await f.store("a", tokens(16))
        await f.store("b", tokens(8))
        q = block_hashes(tokens(16), BS)
        assert await index.match(M, q) == {"a": 4, "b": 2}
        assert await index.match(M, block_hashes(tokens(16, 100), BS)) == {}
        assert await index.match(M, []) == {}

    async def test_removed_block_ends_the_prefix_there(self, index):
        f = Feeder(index)
        await f.store("a", tokens(16))
        h = block_hashes(tokens(16), BS)
        await f.send("a", BlockRemoved((h[1],)))
        assert await index.match(M, h) == {"a": 1}

    async def test_cleared_worker_holds_nothing(self, index):
        f = Feeder(index)
        await f.store("a", tokens(16))
        await f.store("b", tokens(16))
        await f.send("a", AllBlocksCleared())
        assert await index.match(M, block_hashes(tokens(16), BS)) == {"b": 4}

    async def test_redelivered_batch_changes_nothing(self, index):
        f = Feeder(index)
        await f.store("a", tokens(8))
        h = block_hashes(tokens(8), BS)
        batch = KvEventBatch("a", M, 2, 0.0, (BlockRemoved((h[0],)),))
        res = await index.apply(M, "a", 2, f.seq, ops_of(batch))
        assert not res.applied
        assert await index.match(M, h) == {"a": 2}
        assert await index.applied_seq() == f.seq

    async def test_event_id_gap_is_reported(self, index):
        f = Feeder(index)
        assert (await f.store("a", tokens(4))).gap is False
        res = await f.send("a", BlockStored((123,), None, tuple(tokens(4, 50)), BS), event_id=5)
        assert res.applied and res.gap

    async def test_drop_worker(self, index):
        f = Feeder(index)
        await f.store("a", tokens(8))
        await f.store("b", tokens(8))
        await index.drop_worker(M, "a")
        assert await index.match(M, block_hashes(tokens(8), BS)) == {"b": 2}
        await f.store("c", tokens(8))  # a new holder reads no stale bits
        assert await index.match(M, block_hashes(tokens(8), BS)) == {"b": 2, "c": 2}

    async def test_a_dropped_worker_that_comes_back_starts_empty(self, index):
        f = Feeder(index)
        await f.store("a", tokens(16))
        await index.drop_worker(M, "a")
        f.relays.pop("a")
        await f.store("a", tokens(4))
        assert await index.match(M, block_hashes(tokens(16), BS)) == {"a": 1}

    async def test_models_are_isolated(self, index):
        f = Feeder(index)
        await f.store("a", tokens(8))
        assert await index.match("other", block_hashes(tokens(8), BS)) == {}

    async def test_route_prefers_overlap_and_reserves(self, index):
        f = Feeder(index)
        await f.store("a", tokens(32))
        h = block_hashes(tokens(32), BS)
        p = pool("a", "b")
        out = await index.route(call("r1", h, 8, p, now_ms=1000))
        assert out.winner == "a" and (out.overlap("a"), out.overlap("b")) == (8, 0)
        assert (out.cost("a"), out.cost("b")) == (8.0, 16.0)  # pw*max(0+8-8,0)+0+8 vs pw*8+0+8
        assert await index.reserved(M, "a") == (0, 8)
        # the reservation makes a second identical request weigh a's decode load
        out2 = await index.route(call("r2", h, 8, p, now_ms=1001))
        assert (out2.cost("a"), out2.cost("b")) == (16.0, 16.0)
        assert (out2.load("a"), out2.load("b")) == (8, 0)  # a's reserved (prefill 0 + decode 8)
        assert await index.release("r1")
        assert await index.release("r2")
        assert await index.reserved(M, "a") == (0, 0)
        assert await index.reserved(M, "b") == (0, 0)
        assert not await index.release("r1")

    async def test_reported_load_and_prefill_release(self, index):
        h = block_hashes(tokens(16), BS)
        p = pool("a", "b", a=(0.0, 100.0))
        out = await index.route(call("r1", h, 4, p, prefill_weight=2.0, now_ms=1))
        assert out.winner == "b" and (out.cost("a"), out.cost("b")) == (112.0, 12.0)
        assert await index.reserved(M, "b") == (4, 4)
        await index.release("r1", prefill_only=True)
        assert await index.reserved(M, "b") == (0, 4)

    async def test_prefill_overhead_counts_each_queued_prefill(self, index):
        """A second cache hit queued behind a first one on ``a`` loses to a miss on an idle
        ``b`` once each prefill costs a fixed overhead; without it the hit keeps winning."""
        f = Feeder(index)
        await f.store("a", tokens(32))  # 8 blocks
        h = block_hashes(tokens(32), BS)
        p = pool("a", "b")

        async def route(rid: str, ovh: int) -> tuple[str, tuple[float, float]]:
            out = await index.route(
                call(rid, h, 9, p, prefill_weight=2.0, prefill_overhead_blocks=ovh, now_ms=1)
            )
            return out.winner, (out.cost("a"), out.cost("b"))

        # a: 2*(max(0+9-8, 0) + 6) + 0 + 9; b: 2*(9 + 6) + 0 + 9
        assert await route("r1", 6) == ("a", (23.0, 39.0))
        assert await index.reserved(M, "a") == (1 + 6, 9)  # the overhead is reserved too
        # a: 2*(max(7+9-8, 0) + 6) + 9 + 9
        assert await route("r2", 6) == ("b", (46.0, 39.0))
        await index.release("r1", prefill_only=True)
        assert await index.reserved(M, "a") == (0, 9)
        for rid in ("r1", "r2"):
            await index.release(rid)
        assert await route("r3", 0) == ("a", (11.0, 27.0))
        assert await route("r4", 0) == ("a", (22.0, 27.0))

    async def test_reservations_expire(self, index):
        h = block_hashes(tokens(8), BS)
        p = pool("a")
        await index.route(call("r1", h, 2, p, now_ms=1000, ttl_ms=50))
        assert await index.reserved(M, "a") == (2, 2)
        await index.route(call("", h, 2, p, now_ms=2000))  # expiry is lazy
        assert await index.reserved(M, "a") == (0, 0)

    @pytest.mark.parametrize(("rand", "winner"), [(0.0, "a"), (0.99, "b")])
    async def test_ties_broken_by_the_callers_draw(self, index, rand, winner):
        out = await index.route(call("", (1, 2), 2, pool("a", "b"), rand=rand, now_ms=1))
        assert out.winner == winner

    async def test_temperature_samples(self, index):
        p = pool("a", "b", a=(0.0, 1.0))
        picks = set()
        for i in range(20):
            out = await index.route(call("", (1,), 1, p, temperature=5.0, rand=i / 20, now_ms=1))
            picks.add(out.winner)
        assert picks == {"a", "b"}

    async def test_a_clear_loser_is_never_drawn(self, index):
        p = pool("a", "b", a=(0.0, 5.0))  # a costs 5 more: 5 temperatures of 1
        for rand in (0.0, 0.5, 0.9999):
            out = await index.route(call("", (1,), 1, p, temperature=1.0, rand=rand, now_ms=1))
            assert out.winner == "b"

    async def test_gaps_are_only_skipped_event_ids(self, index):
        f = Feeder(index)
        first = await f.send("a", BlockStored((1,), None, tuple(tokens(4)), BS), event_id=7)
        assert first.applied and not first.gap  # a worker's first batch: nothing to compare
        nxt = await f.send("a", BlockStored((2,), 1, tuple(tokens(4, 4)), BS), event_id=8)
        assert not nxt.gap
        assert (await f.send("a", AllBlocksCleared(), event_id=10)).gap
        await index.drop_worker(M, "a")  # forgets its event id too
        assert not (await f.send("a", AllBlocksCleared(), event_id=3)).gap

    async def test_a_store_after_a_clear_in_one_batch_lands(self, index):
        f = Feeder(index)
        await f.store("a", tokens(8))
        fleet = tuple(block_hashes(tokens(8, 40), BS))
        await f.send("a", AllBlocksCleared(), BlockStored(fleet, None, tuple(tokens(8, 40)), BS))
        assert await index.match(M, block_hashes(tokens(8), BS)) == {}
        assert await index.match(M, fleet) == {"a": 2}

    async def test_workers_lists_one_models_workers(self, index):
        f = Feeder(index)
        await f.store("a", tokens(4))
        await index.apply("other", "z", 1, 0, ())
        assert await index.workers(M) == {"a"}
        assert await index.workers("other") == {"z"}

    async def test_a_reservation_expires_at_its_deadline(self, index):
        h = block_hashes(tokens(16), BS)
        p = pool("a")
        await index.route(call("r1", h, 4, p, now_ms=1000, ttl_ms=500))
        assert await index.reserved(M, "a") == (4, 4)
        await index.route(call("", h, 4, p, now_ms=1500))  # exactly at 1000 + 500
        assert await index.reserved(M, "a") == (0, 0)
        assert not await index.release("r1")

    async def test_a_worker_missing_a_middle_block_stops_there_while_others_go_on(self, index):
        f = Feeder(index)
        await f.store("a", tokens(16))
        await f.store("b", tokens(16))
        h = block_hashes(tokens(16), BS)
        await f.send("a", BlockRemoved((h[1],)))
        assert await index.match(M, h) == {"a": 1, "b": 4}  # a's block 2 does not count

    async def test_routing_a_request_again_replaces_its_reservation(self, index):
        h = block_hashes(tokens(16), BS)
        p = pool("a")
        await index.route(call("r1", h, 4, p, now_ms=1))
        await index.route(call("r1", h, 4, p, now_ms=2))
        assert await index.reserved(M, "a") == (4, 4)  # once, not twice
        await index.route(call("r2", h, 4, p, now_ms=3))
        assert await index.reserved(M, "a") == (8, 8)  # two requests add up

    async def test_the_match_ends_where_no_remaining_worker_holds_the_block(self, index):
        f = Feeder(index)
        await f.store("a", tokens(8))  # blocks 0, 1
        await f.store("c", tokens(16))
        h = block_hashes(tokens(16), BS)
        await f.send("c", BlockRemoved((h[1],)))  # c: 0, 2, 3
        assert await index.match(M, h) == {"a": 2, "c": 1}

    # ------------------------------------------------------------------ who is scored
    async def test_a_holder_outside_the_sample_is_scored(self, index):
        """The router samples two of six; the index adds the holder of the deepest blocks."""
        f = Feeder(index)
        await f.store("e", tokens(32))
        await f.store("f", tokens(8))
        await ready(index)
        h = block_hashes(tokens(32), BS)
        p = pool("a", "b", "c", "d", "e", "f")
        out = await index.route(call("", h, 8, p, ("a", "b"), now_ms=1))
        assert out.winner == "e"
        assert {s.worker_id: s.overlap_blocks for s in out.scored} == {
            "a": 0,
            "b": 0,
            "e": 8,
            "f": 2,
        }

    async def test_holders_are_scored_deepest_first_up_to_the_cap(self, index):
        f = Feeder(index)
        for w, n in (("c", 32), ("d", 24), ("e", 16), ("f", 8)):
            await f.store(w, tokens(n))
        await ready(index)
        h = block_hashes(tokens(32), BS)
        p = pool("a", "b", "c", "d", "e", "f")
        out = await index.route(call("", h, 8, p, ("a",), max_holders=2, now_ms=1))
        assert {s.worker_id for s in out.scored} == {"a", "c", "d"}
        out = await index.route(call("", h, 8, p, ("a",), max_holders=0, now_ms=1))
        assert {s.worker_id for s in out.scored} == {"a"}

    async def test_a_holder_outside_the_pool_is_not_scored(self, index):
        """A worker of another role (or draining) holds the prefix: it is not the router's to
        send to."""
        f = Feeder(index)
        await f.store("x", tokens(32))
        await f.store("b", tokens(8))
        await ready(index)
        h = block_hashes(tokens(32), BS)
        out = await index.route(call("", h, 8, pool("a", "b", "c"), ("a",), now_ms=1))
        assert {s.worker_id for s in out.scored} == {"a", "b"}

    async def test_a_hinted_worker_is_scored_with_its_hint(self, index):
        h = block_hashes(tokens(32), BS)
        p = pool("a", "b", "c")
        out = await index.route(call("", h, 8, p, ("a",), hints={"c": 5}, now_ms=1))
        assert out.winner == "c" and out.overlap("c") == 5

    async def test_the_best_candidates_come_winner_first(self, index):
        f = Feeder(index)
        await f.store("b", tokens(32))
        h = block_hashes(tokens(32), BS)
        out = await index.route(call("", h, 8, pool("a", "b", "c"), now_ms=1))
        assert [s.worker_id for s in out.best(2)] == ["b", "a"]

    # ------------------------------------------------------------------ tiers (host memory)
    async def test_a_host_tier_continues_the_gpu_prefix_at_its_weight(self, index):
        """``a`` holds blocks 0-3 on its GPU and 4-11 in host memory; ``b`` holds 0-5 on its
        GPU. Ignoring tiers, ``b`` wins; counting a host block as 0.75 of a hit (4 + 6), ``a``.
        A block only in ``a``'s host tier past a hole does not count (contiguous only)."""
        f = Feeder(index)
        toks = tokens(64)  # 16 blocks
        h = tuple(block_hashes(toks, BS))
        await f.send("a", BlockStored(h[:4], None, tuple(toks[:16]), BS))
        await f.send("a", BlockStored(h[4:12], h[3], tuple(toks[16:48]), BS, medium="CPU"))
        await f.send("a", BlockStored(h[13:14], h[12], tuple(toks[52:56]), BS, medium="CPU"))
        await f.store("b", toks[:24])
        p = pool("a", "b")

        def at(rid: str, weight: float) -> RouteCall:
            return call(rid, h, 16, p, now_ms=1, host_weight=weight)

        out = await index.route(at("", 0.0))
        assert out.winner == "b" and (out.overlap("a"), out.overlap("b")) == (4, 6)
        out = await index.route(at("", 0.75))
        assert out.winner == "a" and (out.overlap("a"), out.overlap("b")) == (4 + 6, 6)
        # the block stored in the host tier is still cached on the worker while in any tier
        await f.send("a", BlockRemoved(h[2:4]))  # GPU: 0-1 left; 2-3 in no tier
        out = await index.route(at("", 0.75))
        assert (out.overlap("a"), out.overlap("b")) == (2, 6)
        await f.send("a", BlockStored(h[2:4], h[1], tuple(toks[8:16]), BS, medium="CPU"))
        out = await index.route(at("", 0.75))
        assert (out.overlap("a"), out.overlap("b")) == (2 + 7, 6)  # blocks 2-11 from the host

    async def test_a_tier_removal_and_a_clear_of_every_tier(self, index):
        f = Feeder(index)
        toks = tokens(32)
        h = tuple(block_hashes(toks, BS))
        await f.send("a", BlockStored(h, None, tuple(toks), BS, medium="CPU"))
        route = call("", h, 8, pool("a"), now_ms=1, host_weight=0.5)
        assert (await index.route(route)).overlap("a") == 4
        assert await f.send("a", BlockRemoved(h[4:], medium="CPU"))
        assert (await index.route(route)).overlap("a") == 2
        await f.send("a", BlockStored(h[:2], None, tuple(toks[:8]), BS))
        assert (await index.route(route)).overlap("a") == 2 + 1
        await f.send("a", AllBlocksCleared(medium="GPU"))  # the host tier keeps its blocks
        assert (await index.route(route)).overlap("a") == 2
        await f.send("a", AllBlocksCleared())  # every tier
        assert (await index.route(route)).overlap("a") == 0
        # the tier's blocks went with the worker's event ids: no gap was seen on the way
        res = await f.send("a", BlockStored(h[:1], None, tuple(toks[:4]), BS))
        assert res.applied and not res.gap
