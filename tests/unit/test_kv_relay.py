"""A worker's KV relay (``workers/kv_relay.py``): engine events in, the fleet's (v3) out."""

from __future__ import annotations

import pytest

from router.kv.translate import ClearOp, RemoveOp, ShapeOp, StoreOp, legacy, ops_of
from schemas.hashing import block_hashes, hash_seed
from schemas.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventBatch,
    ShapeChanged,
)
from tests.support.kv_events import kv_batch
from workers.kv_relay import KvRelay

BS = 4


def stores(events: list) -> list[BlockStored]:
    return [e for e in events if isinstance(e, BlockStored)]


def shapes(events: list) -> list[tuple[bool, str]]:
    return [(e.prefix_closed, e.medium) for e in events if isinstance(e, ShapeChanged)]


def test_an_engine_hashing_like_the_fleet_passes_through_without_its_tokens():
    relay = KvRelay(True, 4)
    toks = tuple(range(24))
    h = tuple(block_hashes(toks, BS))
    (first,) = stores(relay.relay([BlockStored(h[:3], None, toks[:12], BS)]))
    assert first.block_hashes is h[:3] or first.block_hashes == h[:3]
    assert first.parent_block_hash is None and first.token_ids == ()
    (second,) = stores(relay.relay([BlockStored(h[3:], h[2], toks[12:], BS)]))
    assert second.block_hashes == h[3:] and second.parent_block_hash == h[2]


def test_opaque_engine_hashes_are_recomputed_and_chained():
    relay = KvRelay(False, 4)
    toks = tuple(range(12))
    fleet = tuple(block_hashes(toks, BS))
    (a,) = stores(relay.relay([BlockStored((901, 902), None, toks[:8], BS)]))
    (b,) = stores(relay.relay([BlockStored((903,), 902, toks[8:], BS)]))
    assert a.block_hashes == fleet[:2] and b.block_hashes == fleet[2:]
    assert b.parent_block_hash == fleet[1]
    (gone,) = relay.relay([BlockRemoved((903, 777))])  # 777 was never stored: left out
    assert gone == BlockRemoved(fleet[2:])


@pytest.mark.parametrize("branch_blocks", [1, 2, 4])
def test_opaque_hashes_follow_the_workers_branch_setting(branch_blocks):
    relay = KvRelay(False, branch_blocks)
    toks = tuple(range(16))
    (a,) = stores(relay.relay([BlockStored((1, 2, 3, 4), None, toks, BS)]))
    assert a.block_hashes == tuple(block_hashes(toks, BS, branch_blocks=branch_blocks))


def test_opaque_hashes_use_the_lora_seed():
    relay = KvRelay(False, 4)
    toks = tuple(range(8))
    (a,) = stores(relay.relay([BlockStored((7, 8), None, toks, BS, "adapter")]))
    assert a.block_hashes == tuple(block_hashes(toks, BS, hash_seed("adapter")))


def test_a_run_whose_parent_was_never_seen_is_dropped():
    relay = KvRelay(False, 4)
    assert relay.relay([BlockStored((5, 6), 99, tuple(range(8)), BS)]) == []
    assert relay.dropped_runs == 1


def test_a_parent_in_another_tier_chains_the_run():
    relay = KvRelay(False, 4)
    toks = tuple(range(12))
    fleet = tuple(block_hashes(toks, BS))
    relay.relay([BlockStored((1, 2), None, toks[:8], BS, medium="CPU")])
    (run,) = stores(relay.relay([BlockStored((3,), 2, toks[8:], BS)]))
    assert run.block_hashes == fleet[2:] and run.medium == "GPU"


def test_the_shape_is_announced_when_it_changes_and_again_after_a_clear():
    relay = KvRelay(True, 4)
    h = tuple(block_hashes(tuple(range(12)), BS))
    assert shapes(relay.relay([BlockStored(h, None, (), BS)])) == [(True, "GPU")]
    assert shapes(relay.relay([BlockStored(h[2:], h[1], (), BS)])) == []  # unchanged
    assert shapes(relay.relay([BlockRemoved(h[1:2])])) == [(False, "GPU")]  # a hole
    assert shapes(relay.relay([BlockStored(h[1:2], h[0], (), BS)])) == [(True, "GPU")]
    # a clear: the index gives the worker a new slot, which must hear its shape again
    out = relay.relay([AllBlocksCleared(), BlockStored(h, None, (), BS)])
    assert shapes(out) == [(True, "GPU"), (True, "CPU"), (True, "DISK")]


def test_tiers_have_shapes_of_their_own():
    relay = KvRelay(True, 4)
    h = tuple(block_hashes(tuple(range(12)), BS))
    out = relay.relay([BlockStored(h[1:], h[0], (), BS, medium="CPU")])
    assert shapes(out) == [(False, "CPU")]  # its parent is in no tier of its own


def test_ops_of_a_batch_name_the_holder_of_each_tier():
    relay = KvRelay(True, 4)
    h = tuple(block_hashes(tuple(range(8)), BS))
    events = relay.relay(
        [
            BlockStored(h, None, (), BS),
            BlockStored(h[:1], None, (), BS, medium="CPU"),
            BlockRemoved(h[1:], "GPU"),
            AllBlocksCleared("CPU"),
        ]
    )
    ops = ops_of(kv_batch("w", 1, *events))
    assert ops == [
        StoreOp("w", h),
        StoreOp("w CPU", h[:1]),
        RemoveOp("w", h[1:]),
        ClearOp("w CPU"),
        ShapeOp("w", True),
        ShapeOp("w CPU", True),
    ]


def test_a_batch_of_an_older_release_is_legacy():
    assert legacy(KvEventBatch("w", "m", 1, 0.0, (), v=2))
    assert not legacy(kv_batch("w", 1))
