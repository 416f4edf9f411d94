"""The mocker's KV block pool: reference counts, prefix cache keyed by the fleet's chained block
hash, LRU eviction of free cached blocks, and the event outbox (stored / removed / cleared)."""

from __future__ import annotations

import pytest

from schemas.hashing import block_hashes
from schemas.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from workers.engines.mocker.block_pool import BlockPool

BS = 2


def committed(pool: BlockPool, tokens: list[int], parent: int | None = None) -> list[int]:
    """Allocate and commit blocks holding ``tokens`` (full blocks); return the block ids."""
    n = len(tokens) // BS
    blocks = pool.allocate(n)
    assert blocks is not None
    pool.commit(blocks, block_hashes(tokens, BS, 0, parent), tokens, parent)
    return blocks


def test_counts_and_allocation_limits() -> None:
    pool = BlockPool(4, BS)
    assert (pool.num_free, pool.num_used, pool.usage) == (4, 0, 0.0)
    a = pool.allocate(3)
    assert a is not None and len(set(a)) == 3
    assert (pool.num_free, pool.num_used, pool.usage) == (1, 3, 0.75)
    assert pool.allocate(2) is None  # all or nothing
    assert pool.num_free == 1
    pool.free(a)
    assert (pool.num_free, pool.num_used) == (4, 0)
    assert pool.take_events() == []  # nothing was ever committed


def test_commit_queues_one_stored_event_per_run_with_parent_chain() -> None:
    pool = BlockPool(8, BS)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    hashes = block_hashes(tokens, BS)
    committed(pool, tokens[:4])
    committed(pool, tokens[4:], parent=hashes[1])
    assert pool.take_events() == [
        BlockStored(tuple(hashes[:2]), None, (1, 2, 3, 4), BS),
        BlockStored(tuple(hashes[2:]), hashes[1], (5, 6, 7, 8), BS),
    ]
    assert pool.take_events() == []  # drained
    assert pool.num_cached == 4


def test_lora_name_travels_in_the_event() -> None:
    pool = BlockPool(4, BS)
    blocks = pool.allocate(1)
    assert blocks is not None
    pool.commit(blocks, [99], [1, 2], None, "adapter-x")
    assert pool.take_events() == [BlockStored((99,), None, (1, 2), BS, "adapter-x")]


def test_match_prefix_stops_at_first_miss_and_take_shares_blocks() -> None:
    pool = BlockPool(8, BS)
    tokens = [1, 2, 3, 4, 5, 6]
    blocks = committed(pool, tokens)
    hashes = block_hashes(tokens, BS)
    other = block_hashes([1, 2, 9, 9, 5, 6], BS)
    assert pool.match_prefix(hashes) == blocks
    assert pool.match_prefix(other) == blocks[:1]
    assert pool.match_prefix(block_hashes([7, 7], BS)) == []
    pool.take(blocks[:2])
    assert [pool.ref_count(b) for b in blocks] == [2, 2, 1]
    pool.free(blocks)
    assert [pool.ref_count(b) for b in blocks] == [1, 1, 0]
    assert pool.count_unreferenced(blocks) == 1


def test_free_cached_blocks_stay_matchable_until_evicted() -> None:
    pool = BlockPool(4, BS)
    tokens = [1, 2, 3, 4]
    blocks = committed(pool, tokens)
    pool.free(blocks)
    assert pool.num_free == 4 and pool.num_cached == 2
    hit = pool.match_prefix(block_hashes(tokens, BS))
    assert hit == blocks
    pool.take(hit)  # a hit takes the free blocks back out of the free list
    assert pool.num_free == 2 and pool.num_used == 2


def test_uncommitted_free_blocks_are_reused_before_cached_ones() -> None:
    pool = BlockPool(3, BS)
    cached = committed(pool, [1, 2])
    scratch = pool.allocate(2)
    assert scratch is not None
    pool.free(cached)
    pool.free(scratch)
    pool.take_events()
    again = pool.allocate(2)
    assert again is not None and sorted(again) == sorted(scratch)
    assert pool.take_events() == []  # no eviction needed
    assert pool.match_prefix(block_hashes([1, 2], BS)) == cached


def test_eviction_is_lru_tail_first_and_queues_removed() -> None:
    pool = BlockPool(4, BS)
    a_tokens, b_tokens = [1, 2, 3, 4], [5, 6, 7, 8]
    ha, hb = block_hashes(a_tokens, BS), block_hashes(b_tokens, BS)
    a = committed(pool, a_tokens)
    b = committed(pool, b_tokens)
    pool.free(a)  # a freed first: older; within a sequence the tail goes first
    pool.free(b)
    pool.take_events()
    assert pool.allocate(1) == [a[1]]
    assert pool.take_events() == [BlockRemoved((ha[1],))]
    assert pool.allocate(2) == [a[0], b[1]]
    assert pool.take_events() == [BlockRemoved((ha[0], hb[1]))]
    assert pool.match_prefix(ha) == []
    assert pool.match_prefix(hb) == [b[0]]
    assert pool.num_cached == 1


def test_a_cache_hit_refreshes_lru_position() -> None:
    pool = BlockPool(2, BS)
    a = committed(pool, [1, 2])
    b = committed(pool, [3, 4])
    pool.free(a)
    pool.free(b)
    pool.take(a)  # reuse a: it becomes the most recently used once freed again
    pool.free(a)
    pool.take_events()
    assert pool.allocate(1) == b
    assert pool.take_events() == [BlockRemoved(tuple(block_hashes([3, 4], BS)))]


def test_duplicate_content_is_not_registered_twice() -> None:
    pool = BlockPool(4, BS)
    first = committed(pool, [1, 2, 3, 4])
    second = pool.allocate(2)
    assert second is not None
    pool.commit(second, block_hashes([1, 2, 3, 4], BS), [1, 2, 3, 4], None)
    events = pool.take_events()
    assert len(events) == 1  # only the first copy was stored
    assert pool.block_hash(second[0]) is None
    pool.free(second)  # private copies go back uncached, to the front of the free list
    assert pool.num_cached == 2
    assert pool.match_prefix(block_hashes([1, 2, 3, 4], BS)) == first


def test_duplicate_in_the_middle_splits_the_run() -> None:
    pool = BlockPool(8, BS)
    tokens = [1, 2, 3, 4, 5, 6]
    h = block_hashes(tokens, BS)
    committed(pool, tokens[:4])  # blocks 0 and 1 of the chain are cached elsewhere
    pool.take_events()
    blocks = pool.allocate(3)
    assert blocks is not None
    pool.commit(blocks, h, tokens, None)
    assert pool.take_events() == [BlockStored((h[2],), h[1], (5, 6), BS)]


def test_reset_only_when_nothing_is_in_use() -> None:
    pool = BlockPool(4, BS)
    blocks = committed(pool, [1, 2, 3, 4])
    pool.take_events()
    assert pool.reset_prefix_cache() is False
    assert pool.take_events() == []
    pool.free(blocks)
    assert pool.reset_prefix_cache() is True
    assert pool.take_events() == [AllBlocksCleared()]
    assert pool.num_cached == 0 and pool.num_free == 4
    assert pool.match_prefix(block_hashes([1, 2, 3, 4], BS)) == []
    assert pool.allocate(4) is not None
    assert pool.take_events() == []  # nothing left to evict


def test_caching_disabled_stores_and_matches_nothing() -> None:
    pool = BlockPool(4, BS, enable_caching=False)
    committed(pool, [1, 2, 3, 4])
    assert pool.take_events() == []
    assert pool.num_cached == 0
    assert pool.match_prefix(block_hashes([1, 2, 3, 4], BS)) == []


def test_snapshot_replays_cached_chains_parents_first() -> None:
    pool = BlockPool(4, BS)
    tokens = [1, 2, 3, 4]
    h = block_hashes(tokens, BS)
    pool.free(committed(pool, tokens))
    assert pool.snapshot_events() == [
        AllBlocksCleared(),
        BlockStored((h[0],), None, (1, 2), BS),
        BlockStored((h[1],), h[0], (3, 4), BS),
    ]


def test_snapshot_leaves_out_blocks_whose_parent_was_evicted() -> None:
    pool = BlockPool(3, BS)
    blocks = committed(pool, [1, 2, 3, 4])
    pool.free(blocks[:1])  # the head is freed first, so it is evicted first
    pool.free(blocks[1:])
    assert pool.allocate(2) is not None  # the never-used block, then the head
    assert pool.num_cached == 1
    assert pool.snapshot_events() == [AllBlocksCleared()]


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_allocating_k_blocks_from_a_full_cache_evicts_the_k_least_recent(k: int) -> None:
    pool = BlockPool(4, BS)
    hashes = []
    for i in range(4):  # four one-block sequences, freed in order 0..3
        tokens = [i, i]
        pool.free(committed(pool, tokens))
        hashes.append(block_hashes(tokens, BS)[0])
    pool.take_events()
    assert pool.allocate(k) is not None
    assert pool.take_events() == [BlockRemoved(tuple(hashes[:k]))]
    assert pool.num_cached == 4 - k


def test_a_cached_block_inside_a_commit_flushes_the_run_before_it() -> None:
    pool = BlockPool(6, BS)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    h = block_hashes(tokens, BS)
    cached = committed(pool, tokens[:4])  # h0, h1
    pool.free(cached[:1])
    pool.free(cached[1:])
    mine = pool.allocate(5)  # the 4 unused blocks, then the LRU cached one: h0 is evicted
    assert mine is not None
    assert pool.take_events()[-1] == BlockRemoved((h[0],))
    pool.commit(mine[:4], h, tokens, None, "sql")  # h1 is still cached in its own block
    assert pool.take_events() == [
        BlockStored((h[0],), None, (1, 2), BS, "sql"),  # the run before the cached h1
        BlockStored((h[2], h[3]), h[1], (5, 6, 7, 8), BS, "sql"),  # the run after it
    ]


def test_snapshot_skips_every_block_below_an_evicted_one_and_keeps_lora() -> None:
    pool = BlockPool(4, BS)
    tokens = [1, 2, 3, 4, 5, 6]
    h = block_hashes(tokens, BS)
    blocks = pool.allocate(3)
    assert blocks is not None
    pool.commit(blocks, h, tokens, None, "sql")
    pool.free(blocks[:1])
    pool.free(blocks[1:])
    assert pool.allocate(2) is not None  # the unused block, then the head h0
    assert pool.snapshot_events() == [AllBlocksCleared()]  # h1 and h2 hang from nothing
    other = BlockPool(4, BS)
    mine = other.allocate(2)
    assert mine is not None
    other.commit(mine, h[:2], tokens[:4], None, "sql")
    assert other.snapshot_events() == [
        AllBlocksCleared(),
        BlockStored((h[0],), None, (1, 2), BS, "sql"),
        BlockStored((h[1],), h[0], (3, 4), BS, "sql"),
    ]


def test_a_fresh_pool_holds_no_references() -> None:
    pool = BlockPool(4, BS)
    assert [pool.ref_count(b) for b in range(4)] == [0, 0, 0, 0]


def test_a_flushed_run_keeps_the_parent_it_continues() -> None:
    pool = BlockPool(8, BS)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    h = block_hashes(tokens, BS)
    committed(pool, tokens[:2])  # h0, held
    other = pool.allocate(1)
    assert other is not None
    pool.commit(other, h[2:3], tokens[4:6], h[1])  # h2 cached in a block of its own
    blocks = pool.allocate(3)
    assert blocks is not None
    pool.take_events()
    pool.commit(blocks, h[1:4], tokens[2:8], h[0])  # h1 new, h2 cached already, h3 new
    assert pool.take_events() == [
        BlockStored((h[1],), h[0], (3, 4), BS),  # the run before h2 keeps its parent h0
        BlockStored((h[3],), h[2], (7, 8), BS),
    ]


def test_a_broken_chain_does_not_hide_the_healthy_ones_after_it() -> None:
    pool = BlockPool(12, BS)
    broken, healthy = [1, 2, 3, 4, 5, 6], [9, 9, 8, 8]
    hh = block_hashes(healthy, BS)
    blocks = committed(pool, broken)  # hb0 <- hb1 <- hb2
    pool.free(blocks[:1])
    pool.free(blocks[1:])
    taken = pool.allocate(10)  # the 9 unused blocks, then the LRU cached head hb0
    assert taken is not None and pool.num_cached == 2  # hb1 and hb2 hang from nothing
    pool.free(taken[:2])  # two never-committed blocks: reused first
    committed(pool, healthy)
    assert pool.num_cached == 4
    assert pool.snapshot_events() == [
        AllBlocksCleared(),
        BlockStored((hh[0],), None, (9, 9), BS),
        BlockStored((hh[1],), hh[0], (8, 8), BS),
    ]
