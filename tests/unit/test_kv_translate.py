"""EventTranslator: engine -> fleet hashes, fleet-hashing engines, lazy token ids, shape."""

from __future__ import annotations

import msgspec
import pytest

from router.kv.translate import (
    EventTranslator,
    RemoveOp,
    ShapeOp,
    StoreOp,
    WireKvBatch,
    _msgpack_uint_head,
)
from schemas import decode, encode
from schemas.hashing import block_hashes, hash_seed
from schemas.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEventBatch
from tests.support.kv_events import kv_batch

BS = 4


def stores(tr: EventTranslator, b: KvEventBatch) -> list[StoreOp]:
    return [op for op in tr.translate(b).ops if isinstance(op, StoreOp)]


def test_an_engine_hashing_like_the_fleet_is_trusted_after_one_run():
    tr = EventTranslator()
    toks = tuple(range(24))
    h = tuple(block_hashes(toks, BS))
    (first,) = stores(tr, kv_batch("w", 1, BlockStored(h[:3], None, toks[:12], BS)))
    assert first.fleet_hashes is first.engine_hashes and first.parent is None
    assert tr.hashes_like_fleet("w")
    (second,) = stores(tr, kv_batch("w", 2, BlockStored(h[3:], h[2], toks[12:], BS)))
    assert second.fleet_hashes is second.engine_hashes == h[3:]
    assert second.parent == h[2]


def test_a_failed_spot_check_recomputes_and_withdraws_trust():
    tr = EventTranslator()
    toks = tuple(range(16))
    h = tuple(block_hashes(toks, BS))
    stores(tr, kv_batch("w", 1, BlockStored(h[:2], None, toks[:8], BS)))
    opaque = (901, 902)  # the same tokens under the engine's own hashes
    (op,) = stores(tr, kv_batch("w", 2, BlockStored(opaque, h[1], toks[8:], BS)))
    assert op.engine_hashes == opaque and op.fleet_hashes == h[2:]
    assert not tr.hashes_like_fleet("w")


def test_opaque_engine_hashes_are_recomputed_with_the_lora_seed():
    tr = EventTranslator()
    toks = tuple(range(8))
    (op,) = stores(tr, kv_batch("w", 1, BlockStored((7, 8), None, toks, BS, "adapter")))
    assert op.fleet_hashes == tuple(block_hashes(toks, BS, hash_seed("adapter")))
    assert not tr.hashes_like_fleet("w")


# token ids in every msgpack integer width, arrays with 1-, 3- and 5-byte headers
@pytest.mark.parametrize(
    "tokens",
    [
        tuple(range(4)),
        tuple([5, 200, 70000, 3] * 4),
        tuple(range(100, 164)),
        tuple(i % 65536 * 7 for i in range(70000 // 4 * 4)),
    ],
    ids=["fixarray", "mixed widths", "array16", "array32"],
)
@pytest.mark.parametrize("fleet_hashing", [True, False])
def test_lazily_decoded_batches_translate_like_decoded_ones(tokens, fleet_hashing):
    n = len(tokens) // BS
    h = tuple(block_hashes(tokens, BS))
    engine = h if fleet_hashing else tuple(range(1000, 1000 + n))
    b = kv_batch("w", 1, BlockStored(engine, None, tokens, BS))
    eager, lazy = EventTranslator(), EventTranslator()
    wire = decode(encode(b), WireKvBatch)
    for _ in range(2):  # the second round takes the spot-check path when trusted
        assert lazy.translate(wire).ops == eager.translate(b).ops
        eager.forget("w")
        lazy.forget("w")


def test_msgpack_head_reader():
    raw = msgspec.msgpack.encode([1, 300, 70000, 2**31, 5])
    assert _msgpack_uint_head(memoryview(raw), 4) == (5, [1, 300, 70000, 2**31])
    assert _msgpack_uint_head(memoryview(msgspec.msgpack.encode([-1, 2])), 2) is None
    assert _msgpack_uint_head(memoryview(msgspec.msgpack.encode([2**40])), 1) is None
    assert _msgpack_uint_head(memoryview(msgspec.msgpack.encode("abc")), 1) is None
    assert _msgpack_uint_head(memoryview(b"\x94\x01"), 4) is None  # truncated


def test_unreadable_token_ids_are_reported_not_raised():
    bad = msgspec.msgpack.encode(
        {
            "worker_id": "w",
            "model": "m",
            "event_id": 1,
            "ts_s": 0.0,
            "events": [
                {"type": "stored", "block_hashes": [1], "parent_block_hash": None,
                 "token_ids": ["a", "b", "c", "d"], "block_size": BS},
            ],
        }
    )  # fmt: skip
    wire = decode(bad, WireKvBatch)
    out = EventTranslator().translate(wire)
    assert out.unreadable_tokens and not [op for op in out.ops if isinstance(op, StoreOp)]


def shape_ops(tr: EventTranslator, b: KvEventBatch) -> list[bool]:
    return [op.hole_free for op in tr.translate(b).ops if isinstance(op, ShapeOp)]


def test_shape_is_announced_when_it_changes():
    tr = EventTranslator()
    toks = tuple(range(16))
    h = tuple(block_hashes(toks, BS))
    assert shape_ops(tr, kv_batch("w", 1, BlockStored(h, None, toks, BS))) == [True]
    assert shape_ops(tr, kv_batch("w", 2, BlockRemoved((h[3],)))) == []  # a leaf: still closed
    assert shape_ops(tr, kv_batch("w", 3, BlockRemoved((h[1],)))) == [False]  # h[2] orphaned
    assert shape_ops(tr, kv_batch("w", 4, BlockStored((h[1],), h[0], toks[4:8], BS))) == [True]
    assert shape_ops(tr, kv_batch("w", 5, BlockRemoved((h[0],)), AllBlocksCleared())) == []


def test_preload_without_parents_is_holey_until_cleared():
    tr = EventTranslator()
    tr.preload("w", {1: 1})
    assert shape_ops(tr, kv_batch("w", 9, BlockRemoved((1,)))) == [False]
    assert shape_ops(tr, kv_batch("w", 10, AllBlocksCleared())) == [True]
    tr.preload("x", {})
    assert shape_ops(tr, kv_batch("x", 1, BlockRemoved((1,)))) == [True]


def test_removals_carry_one_tuple_for_fleet_hashing_engines():
    tr = EventTranslator()
    toks = tuple(range(8))
    h = tuple(block_hashes(toks, BS))
    tr.translate(kv_batch("w", 1, BlockStored(h, None, toks, BS)))
    (op,) = [
        o for o in tr.translate(kv_batch("w", 2, BlockRemoved(h))).ops if isinstance(o, RemoveOp)
    ]
    assert op.fleet_hashes is op.engine_hashes
