"""The cache shadow: what it forwards, and the snapshot it republishes for a resync."""

from __future__ import annotations

from router.kv.translate import fleet_hashes_for_prompt
from schemas.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvCacheEvent,
)
from tests.support import kv_events
from workers.engines.vllm.cache_shadow import CacheShadow
from workers.kv_relay import KvRelay

BS = 2


def stored(
    hashes: tuple[int, ...], parent: int | None, start: int, lora: str | None = None
) -> BlockStored:
    return kv_events.stored(hashes, parent, BS, start, lora)


def flat(chunks: list[list[KvCacheEvent]]) -> list[KvCacheEvent]:
    return [e for c in chunks for e in c]


def test_forwards_chains_it_can_place_and_drops_orphans() -> None:
    shadow = CacheShadow()
    root = stored((1, 2), None, 0)
    child = stored((3,), 2, 4)
    orphan = stored((9,), 77, 100)
    assert shadow.apply([root, child, orphan]) == [root, child]
    assert shadow.orphans == 1
    assert len(shadow) == 3 and 9 not in shadow


def test_removals_forward_only_known_blocks() -> None:
    shadow = CacheShadow()
    shadow.apply([stored((1, 2), None, 0)])
    assert shadow.apply([BlockRemoved((2, 5))]) == [BlockRemoved((2,))]
    assert shadow.apply([BlockRemoved((5,))]) == []
    assert 1 in shadow and 2 not in shadow


def test_cleared_empties_it_and_is_forwarded() -> None:
    shadow = CacheShadow()
    shadow.apply([stored((1,), None, 0)])
    assert shadow.apply([AllBlocksCleared()]) == [AllBlocksCleared()]
    assert len(shadow) == 0
    # after a clear, a block extending an old one is an orphan
    assert shadow.apply([stored((2,), 1, 2)]) == []


def test_snapshot_is_parents_first_and_leaves_out_unreachable_blocks() -> None:
    shadow = CacheShadow()
    shadow.apply(
        [
            stored((1, 2), None, 0),
            stored((3,), 2, 4),
            stored((4,), 1, 40),  # a branch off block 1
            stored((5, 6), None, 50, lora="a"),
        ]
    )
    shadow.apply([BlockRemoved((5,))])  # 6 is unreachable now
    events = flat(list(shadow.snapshot_events()))
    assert events[0] == AllBlocksCleared()
    seen: set[int] = set()
    for ev in events[1:]:
        assert isinstance(ev, BlockStored)
        assert ev.parent_block_hash is None or ev.parent_block_hash in seen
        seen.update(ev.block_hashes)
    assert seen == {1, 2, 3, 4}
    assert len(events) == 1 + 2  # runs: 1-4 (from the newest leaf up), then 2-3


def test_snapshot_replays_into_the_same_index_state() -> None:
    """The worker's relay, fed the snapshot, maps every reachable engine hash to the fleet hash
    it had when fed the live events."""
    live = [stored((1, 2), None, 0), stored((3,), 2, 4), stored((4,), 1, 40)]
    shadow = CacheShadow()
    shadow.apply(live)

    def mapping(events: list[KvCacheEvent]) -> dict[int, int]:
        relay = KvRelay(False, 4)
        out: dict[int, int] = {}
        for ev in events:
            for got in relay.relay([ev]):
                if isinstance(got, BlockStored) and isinstance(ev, BlockStored):
                    out.update(zip(ev.block_hashes, got.block_hashes, strict=True))
        assert relay.dropped_runs == 0
        return out

    assert mapping(flat(list(shadow.snapshot_events()))) == mapping(list(live))
    assert mapping(list(live))[3] == fleet_hashes_for_prompt(range(6), BS)[2]


def test_snapshot_chunks_by_tokens_and_splits_runs_by_adapter() -> None:
    shadow = CacheShadow()
    shadow.apply([stored(tuple(range(1, 11)), None, 0)])  # 10 blocks, 20 tokens
    chunks = list(shadow.snapshot_events(max_tokens=6))
    assert all(sum(len(e.token_ids) for e in c if isinstance(e, BlockStored)) <= 6 for c in chunks)
    assert [h for e in flat(chunks) if isinstance(e, BlockStored) for h in e.block_hashes] == list(
        range(1, 11)
    )
    assert len(chunks) > 1
    mixed = CacheShadow()
    mixed.apply([stored((1,), None, 0), stored((2,), 1, 2, lora="a")])
    runs = [e for e in flat(list(mixed.snapshot_events())) if isinstance(e, BlockStored)]
    assert [(r.block_hashes, r.lora_name) for r in runs] == [((1,), None), ((2,), "a")]


def test_snapshot_survives_a_parent_cycle() -> None:
    shadow = CacheShadow()
    shadow.apply([stored((1,), None, 0), stored((2,), 1, 2), stored((1,), 2, 4)])  # 1 <-> 2
    assert flat(list(shadow.snapshot_events())) == [AllBlocksCleared()]


def test_each_tier_is_shadowed_and_republished_after_the_gpu() -> None:
    """vLLM offloads a chain's tail to host memory: the host blocks hang off GPU blocks, are
    removed and cleared per tier, and the resync snapshot brings back both tiers, each block
    after its parent (in whichever tier that is)."""
    shadow = CacheShadow()
    host = BlockStored((3, 4), 2, tuple(range(4, 8)), BS, medium="CPU")
    forwarded = shadow.apply([stored((1, 2), None, 0), host])
    assert forwarded[-1] == host  # its parent is a GPU block
    assert (len(shadow), shadow.held("CPU")) == (2, 2)
    # a GPU removal of a hash the host holds leaves the host copy alone
    assert shadow.apply([BlockRemoved((3,))]) == []
    assert shadow.apply([BlockRemoved((4,), medium="CPU")]) == [BlockRemoved((4,), medium="CPU")]
    snapshot = flat(list(shadow.snapshot_events()))
    assert snapshot == [
        AllBlocksCleared(),
        BlockStored((1, 2), None, (0, 1, 2, 3), BS),
        BlockStored((3,), 2, (4, 5), BS, medium="CPU"),
    ]
    assert shadow.apply([AllBlocksCleared(medium="GPU")]) == [AllBlocksCleared(medium="GPU")]
    assert (len(shadow), shadow.held("CPU")) == (0, 1)
    # the host block's parent is gone from every tier: unreachable, left out
    assert flat(list(shadow.snapshot_events())) == [AllBlocksCleared()]
