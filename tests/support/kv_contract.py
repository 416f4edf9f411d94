"""The prefix index contract: one suite, run unchanged against every implementation.

A backend test module subclasses ``IndexContract`` and provides an ``index`` fixture.
"""

from __future__ import annotations

import pytest

from router.kv.routing import CandidateLoad, RouteCall
from router.kv.translate import EventTranslator
from schemas.hashing import block_hashes
from schemas.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEventBatch

BS = 4
M = "m"


def tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


class Feeder:
    """Feeds events through a translator into an index, numbering batches and stream seqs."""

    def __init__(self, index) -> None:
        self.index = index
        self.tr = EventTranslator()
        self.event_ids: dict[str, int] = {}
        self.seq = 0

    async def send(self, worker: str, *events, event_id: int | None = None, seq: int | None = None):
        eid = event_id if event_id is not None else self.event_ids.get(worker, 0) + 1
        self.event_ids[worker] = eid
        self.seq = seq if seq is not None else self.seq + 1
        batch = KvEventBatch(worker, M, eid, 0.0, tuple(events))
        tr = self.tr.translate(batch)
        return await self.index.apply(M, worker, eid, self.seq, tr.ops)

    async def store(self, worker: str, toks: list[int], engine_offset: int = 0, parent=None):
        hashes = block_hashes(toks, BS)
        engine = tuple(h ^ engine_offset for h in hashes) if engine_offset else tuple(hashes)
        return await self.send(worker, BlockStored(engine, parent, tuple(toks), BS))


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
        res = await index.apply(
            M,
            "a",
            2,
            f.seq,
            f.tr.translate(KvEventBatch("a", M, 2, 0.0, (BlockRemoved((h[0],)),))).ops,
        )
        assert not res.applied
        assert await index.match(M, h) == {"a": 2}
        assert await index.applied_seq() == f.seq

    async def test_event_id_gap_is_reported(self, index):
        f = Feeder(index)
        assert (await f.store("a", tokens(4))).gap is False
        res = await f.send("a", BlockStored((123,), None, tuple(tokens(4, 50)), BS), event_id=5)
        assert res.applied and res.gap

    async def test_opaque_engine_hashes_are_mapped(self, index):
        f = Feeder(index)
        toks = tokens(12)
        fleet = block_hashes(toks, BS)
        # a vLLM-like engine: its own hashes, first run of 2 blocks, then 1 more with a parent
        await f.send("a", BlockStored((901, 902), None, tuple(toks[:8]), BS))
        await f.send("a", BlockStored((903,), 902, tuple(toks[8:]), BS))
        assert await index.match(M, fleet) == {"a": 3}
        await f.send("a", BlockRemoved((903,)))
        assert await index.match(M, fleet) == {"a": 2}
        assert await index.worker_mapping(M, "a") == {901: fleet[0], 902: fleet[1]}

    async def test_drop_worker(self, index):
        f = Feeder(index)
        await f.store("a", tokens(8))
        await f.store("b", tokens(8))
        await index.drop_worker(M, "a")
        assert await index.match(M, block_hashes(tokens(8), BS)) == {"b": 2}
        await f.store("c", tokens(8))  # slots are reused without stale bits
        assert await index.match(M, block_hashes(tokens(8), BS)) == {"b": 2, "c": 2}

    async def test_models_are_isolated(self, index):
        f = Feeder(index)
        await f.store("a", tokens(8))
        assert await index.match("other", block_hashes(tokens(8), BS)) == {}

    async def test_route_prefers_overlap_and_reserves(self, index):
        f = Feeder(index)
        await f.store("a", tokens(32))
        h = tuple(block_hashes(tokens(32), BS))
        cands = (CandidateLoad("a"), CandidateLoad("b"))
        out = await index.route(RouteCall(M, "r1", h, 8, cands, now_ms=1000))
        assert out.winner == "a" and out.overlaps == (8, 0)
        assert out.costs == (8.0, 16.0)  # pw*max(0+8-8,0)+0+8 vs pw*8+0+8
        assert await index.reserved(M, "a") == (0, 8)
        # the reservation makes a second identical request weigh a's decode load
        out2 = await index.route(RouteCall(M, "r2", h, 8, cands, now_ms=1001))
        assert out2.costs == (16.0, 16.0)
        assert out2.loads == (8, 0)  # a's reserved blocks (prefill 0 + decode 8), b's none
        assert await index.release("r1")
        assert await index.release("r2")
        assert await index.reserved(M, "a") == (0, 0)
        assert await index.reserved(M, "b") == (0, 0)
        assert not await index.release("r1")

    async def test_reported_load_and_prefill_release(self, index):
        h = tuple(block_hashes(tokens(16), BS))
        cands = (CandidateLoad("a", reported_decode_blocks=100), CandidateLoad("b"))
        out = await index.route(RouteCall(M, "r1", h, 4, cands, prefill_weight=2.0, now_ms=1))
        assert out.winner == "b" and out.costs == (112.0, 12.0)
        assert await index.reserved(M, "b") == (4, 4)
        await index.release("r1", prefill_only=True)
        assert await index.reserved(M, "b") == (0, 4)

    async def test_prefill_overhead_counts_each_queued_prefill(self, index):
        """A second cache hit queued behind a first one on ``a`` loses to a miss on an idle
        ``b`` once each prefill costs a fixed overhead; without it the hit keeps winning."""
        f = Feeder(index)
        await f.store("a", tokens(32))  # 8 blocks
        h = tuple(block_hashes(tokens(32), BS))
        cands = (CandidateLoad("a"), CandidateLoad("b"))

        async def route(rid: str, ovh: int) -> tuple[str, tuple[float, ...]]:
            out = await index.route(RouteCall(M, rid, h, 9, cands, 2.0, ovh, now_ms=1))
            return out.winner, out.costs

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
        h = tuple(block_hashes(tokens(8), BS))
        cands = (CandidateLoad("a"),)
        await index.route(RouteCall(M, "r1", h, 2, cands, now_ms=1000, ttl_ms=50))
        assert await index.reserved(M, "a") == (2, 2)
        await index.route(RouteCall(M, "", h, 2, cands, now_ms=2000))  # expiry is lazy
        assert await index.reserved(M, "a") == (0, 0)

    @pytest.mark.parametrize(("rand", "winner"), [(0.0, "a"), (0.99, "b")])
    async def test_ties_broken_by_the_callers_draw(self, index, rand, winner):
        cands = (CandidateLoad("a"), CandidateLoad("b"))
        out = await index.route(RouteCall(M, "", (1, 2), 2, cands, rand=rand, now_ms=1))
        assert out.winner == winner

    async def test_temperature_samples(self, index):
        cands = (CandidateLoad("a", reported_decode_blocks=1), CandidateLoad("b"))
        picks = set()
        for i in range(20):
            out = await index.route(
                RouteCall(M, "", (1,), 1, cands, temperature=5.0, rand=i / 20, now_ms=1)
            )
            picks.add(out.winner)
        assert picks == {"a", "b"}

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
        fleet = block_hashes(tokens(8, 40), BS)
        await f.send(
            "a", AllBlocksCleared(), BlockStored((501, 502), None, tuple(tokens(8, 40)), BS)
        )
        assert await index.match(M, block_hashes(tokens(8), BS)) == {}
        assert await index.match(M, fleet) == {"a": 2}
        assert await index.worker_mapping(M, "a") == {501: fleet[0], 502: fleet[1]}

    async def test_workers_lists_one_models_workers(self, index):
        f = Feeder(index)
        await f.store("a", tokens(4))
        await index.apply("other", "z", 1, 0, ())
        assert await index.workers(M) == {"a"}
        assert await index.workers("other") == {"z"}
        assert await index.worker_mapping(M, "nobody") == {}

    async def test_a_reservation_expires_at_its_deadline(self, index):
        h = tuple(block_hashes(tokens(16), BS))
        cands = (CandidateLoad("a"),)
        await index.route(RouteCall(M, "r1", h, 4, cands, now_ms=1000, ttl_ms=500))
        assert await index.reserved(M, "a") == (4, 4)
        await index.route(RouteCall(M, "", h, 4, cands, now_ms=1500))  # exactly at 1000 + 500
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
        h = tuple(block_hashes(tokens(16), BS))
        cands = (CandidateLoad("a"),)
        await index.route(RouteCall(M, "r1", h, 4, cands, now_ms=1))
        await index.route(RouteCall(M, "r1", h, 4, cands, now_ms=2))
        assert await index.reserved(M, "a") == (4, 4)  # once, not twice
        await index.route(RouteCall(M, "r2", h, 4, cands, now_ms=3))
        assert await index.reserved(M, "a") == (8, 8)  # two requests add up

    async def test_the_match_ends_where_no_remaining_worker_holds_the_block(self, index):
        f = Feeder(index)
        await f.store("a", tokens(8))  # blocks 0, 1
        await f.store("c", tokens(16))
        h = block_hashes(tokens(16), BS)
        await f.send("c", BlockRemoved((h[1],)))  # c: 0, 2, 3
        assert await index.match(M, h) == {"a": 2, "c": 1}

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
        cands = (CandidateLoad("a"), CandidateLoad("b"))

        def call(rid: str, weight: float) -> RouteCall:
            return RouteCall(M, rid, h, 16, cands, 1.0, now_ms=1, host_weight=weight)

        out = await index.route(call("", 0.0))
        assert out.winner == "b" and out.overlaps == (4, 6)
        out = await index.route(call("", 0.75))
        assert out.winner == "a" and out.overlaps == (4 + 6, 6)  # floor(0.75 * 8)
        # the block stored in the host tier is still cached on the worker while in any tier
        await f.send("a", BlockRemoved(h[2:4]))  # GPU: 0-1 left; 2-3 in no tier
        out = await index.route(call("", 0.75))
        assert out.overlaps == (2, 6)
        await f.send("a", BlockStored(h[2:4], h[1], tuple(toks[8:16]), BS, medium="CPU"))
        out = await index.route(call("", 0.75))
        assert out.overlaps == (2 + 7, 6)  # floor(0.75 * 10): blocks 2-11 from the host

    async def test_a_tier_removal_and_a_clear_of_every_tier(self, index):
        f = Feeder(index)
        toks = tokens(32)
        h = tuple(block_hashes(toks, BS))
        await f.send("a", BlockStored(h, None, tuple(toks), BS, medium="CPU"))
        cands = (CandidateLoad("a"),)
        route = RouteCall(M, "", h, 8, cands, 1.0, now_ms=1, host_weight=0.5)
        assert (await index.route(route)).overlaps == (4,)
        assert await f.send("a", BlockRemoved(h[4:], medium="CPU"))
        assert (await index.route(route)).overlaps == (2,)
        await f.send("a", BlockStored(h[:2], None, tuple(toks[:8]), BS))
        assert (await index.route(route)).overlaps == (2 + 1,)
        await f.send("a", AllBlocksCleared(medium="GPU"))  # the host tier keeps its blocks
        assert (await index.route(route)).overlaps == (2,)
        await f.send("a", AllBlocksCleared())  # every tier
        assert (await index.route(route)).overlaps == (0,)
        # the tier's blocks went with the worker's event ids: no gap was seen on the way
        res = await f.send("a", BlockStored(h[:1], None, tuple(toks[:4]), BS))
        assert res.applied and not res.gap
