"""Cutting KV events into message-sized batches keeps the chain the indexer sees."""

from __future__ import annotations

import pytest

from router.kv.index import InMemoryPrefixIndex
from router.kv.translate import ops_of
from schemas.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from tests.support.kv_events import kv_batch, stored
from workers.kv_batching import split_events
from workers.kv_relay import KvRelay

BS = 4


def test_small_batches_pass_unchanged() -> None:
    events = [AllBlocksCleared(), stored(range(1, 4), None, BS), BlockRemoved((2,))]
    assert split_events(events, max_tokens=100) == [events]


def test_a_long_run_is_cut_into_chained_pieces() -> None:
    groups = split_events([stored(range(1, 11), 99, BS)], max_tokens=4 * BS)
    pieces = [ev for g in groups for ev in g]
    assert [len(p.block_hashes) for p in pieces] == [4, 4, 2]
    assert [p.parent_block_hash for p in pieces] == [99, 4, 8]
    assert b"".join(bytes(p.token_ids) for p in pieces) == bytes(range(10 * BS))
    assert all(len(g) == 1 for g in groups)


def test_limits_hold_and_order_is_kept() -> None:
    events = [stored(range(100 * i, 100 * i + 5), None, BS) for i in range(1, 8)]
    events += [BlockRemoved(tuple(range(50)))]
    groups = split_events(events, max_tokens=12 * BS, max_hashes=20)
    for g in groups:
        assert sum(len(e.token_ids) for e in g if isinstance(e, BlockStored)) <= 12 * BS
        assert sum(len(e.block_hashes) for e in g if not isinstance(e, AllBlocksCleared)) <= 20
    flat = [e for g in groups for e in g]
    assert [e.block_hashes[0] for e in flat if isinstance(e, BlockStored)] == [
        100 * i for i in range(1, 8)
    ]
    assert sum(len(e.block_hashes) for e in flat if isinstance(e, BlockRemoved)) == 50


@pytest.mark.parametrize("limit", [1, 3, 7, 64])
async def test_the_index_is_the_same_however_it_is_cut(limit: int) -> None:
    events = [
        stored(range(1, 10), None, BS),
        stored(range(50, 56), 3, BS),
        BlockRemoved((9, 8)),
        stored(range(70, 75), 55, BS),
    ]

    async def index_of(groups: list) -> dict:
        idx, relay = InMemoryPrefixIndex(), KvRelay(True, 4)
        for k, g in enumerate(groups, 1):
            batch = kv_batch("w", k, *relay.relay(g))
            await idx.apply("m", "w", k, k, ops_of(batch))
        return idx.dump()

    whole = await index_of([events])
    assert await index_of(split_events(events, max_tokens=limit * BS)) == whole
