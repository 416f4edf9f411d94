"""vLLM KV event decoding: golden payloads of every wire generation read with that generation's
structs, hash normalization, filters, frames, gap detection, and the indexer's view."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from router.kv.translate import fleet_hashes_for_prompt
from schemas.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from tests.support.vllm_wire_mirror import (
    AllBlocksClearedV1,
    AllBlocksClearedV2,
    AllBlocksClearedV3,
    BlockRemovedV1,
    BlockRemovedV2,
    BlockRemovedV3,
    BlockStoredV1,
    BlockStoredV2,
    BlockStoredV3,
    KVEventBatchV1,
    KVEventBatchV2,
    KVEventBatchV3,
    encode,
    stored_v3,
)
from workers.engines.vllm.kv_events import (
    BatchReader,
    DecodedBatch,
    DecodeOptions,
    SeqKind,
    SequenceTracker,
    VllmKvDecodeError,
    engine_block_hash,
    fill_gap,
    parse_pub_frames,
    parse_replay_frames,
    replay_request,
)
from workers.kv_relay import KvRelay

TOKENS = [101, 102, 103, 104, 105, 106]  # three blocks of 2
EXPECTED = (
    BlockStored((1, 2), None, (101, 102, 103, 104), 2),
    BlockStored((3,), 2, (105, 106), 2),
    BlockRemoved((3,)),
    AllBlocksCleared(),
)

GOLDEN_CASES: dict[str, bytes] = {
    "v1-array": encode(
        KVEventBatchV1(
            ts=1.5,
            events=[
                BlockStoredV1([1, 2], None, TOKENS[:4], 2, None),
                BlockStoredV1([3], 2, TOKENS[4:], 2, None),
                BlockRemovedV1([3]),
                AllBlocksClearedV1(),
            ],
        )
    ),
    "v2-array": encode(
        KVEventBatchV2(
            ts=1.5,
            events=[
                BlockStoredV2([1, 2], None, TOKENS[:4], 2, None, "GPU"),
                BlockStoredV2([3], 2, TOKENS[4:], 2, None, "GPU"),
                BlockRemovedV2([3], "GPU"),
                AllBlocksClearedV2(),
            ],
            data_parallel_rank=0,
        )
    ),
    "v3-map": encode(
        KVEventBatchV3(
            ts=1.5,
            events=[
                stored_v3([1, 2], None, TOKENS[:4], 2),
                stored_v3([3], 2, TOKENS[4:], 2, extra_keys=[None], group_idx=0),
                BlockRemovedV3([3], "GPU"),
                AllBlocksClearedV3(),
            ],
        )
    ),
}


def _pack(obj: Any) -> bytes:
    return msgspec.msgpack.encode(obj)


def decode_batch(payload: bytes, options: DecodeOptions | None = None) -> DecodedBatch:
    """As a worker on the latest mirrored release (vLLM 0.25) reads its payloads."""
    return BatchReader(KVEventBatchV3, options).decode(payload)


BATCH_TYPES = {"v1-array": KVEventBatchV1, "v2-array": KVEventBatchV2, "v3-map": KVEventBatchV3}


@pytest.mark.parametrize("generation", list(GOLDEN_CASES))
def test_every_generation_read_with_its_structs_gives_the_same_events(generation: str) -> None:
    batch = BatchReader(BATCH_TYPES[generation]).decode(GOLDEN_CASES[generation])
    assert batch.events == EXPECTED
    assert batch.ts_s == 1.5
    assert batch.skipped == 0


def test_golden_bytes_of_an_array_like_batch() -> None:
    """The msgpack vLLM's array_like structs produce, spelled out byte by byte."""
    golden = bytes.fromhex(
        "93"  # batch: array of 3 (ts, events, data_parallel_rank)
        "cb3ff8000000000000"  # ts: float64 1.5
        "91"  # events: array of 1
        "97"  # event: array of 7 (tag + 6 fields)
        "ab426c6f636b53746f726564"  # "BlockStored"
        "9101"  # block_hashes [1]
        "c0"  # parent_block_hash None
        "920708"  # token_ids [7, 8]
        "02"  # block_size 2
        "c0"  # lora_id None
        "a3475055"  # medium "GPU"
        "00"  # data_parallel_rank 0
    )
    mirrored = KVEventBatchV2(1.5, [BlockStoredV2([1], None, [7, 8], 2, None, "GPU")], 0)
    assert encode(mirrored) == golden
    batch = BatchReader(KVEventBatchV2).decode(golden)
    assert batch.events == (BlockStored((1,), None, (7, 8), 2),)
    assert batch.data_parallel_rank == 0


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (5, 5),
        (-1, 2**64 - 1),  # early vLLM: Python hash(), signed
        (2**64 + 7, 7),
        (b"\x00" * 24 + bytes.fromhex("0102030405060708"), 0x0102030405060708),
        (bytes.fromhex("ff" * 24 + "00000000000000ff"), 255),
        (b"\x01\x02", 0x0102),  # shorter than 8 bytes: the value as is
    ],
)
def test_engine_block_hash_normalization(raw: int | bytes, expected: int) -> None:
    assert engine_block_hash(raw) == expected


def test_bytes_hashes_equal_vllms_own_int_conversion() -> None:
    """vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 sends
    int.from_bytes(h, 'big') & (2**64 - 1): the same int we derive from the bytes."""
    digest = bytes(range(32))
    assert engine_block_hash(digest) == int.from_bytes(digest, "big") & (2**64 - 1)
    payload = encode(KVEventBatchV3(ts=0.0, events=[stored_v3([digest], digest, [1, 2], 2)]))
    (ev,) = decode_batch(payload).events
    assert isinstance(ev, BlockStored)
    assert ev.block_hashes == (engine_block_hash(digest),)
    assert ev.parent_block_hash == engine_block_hash(digest)


@pytest.mark.parametrize("bad", [True, 1.5, "abc", None, [1]])
def test_engine_block_hash_rejects_non_hashes(bad: object) -> None:
    with pytest.raises(VllmKvDecodeError):
        engine_block_hash(bad)


def test_host_and_disk_tiers_keep_their_medium_other_media_and_groups_are_skipped() -> None:
    payload = encode(
        KVEventBatchV3(
            ts=0.0,
            events=[
                stored_v3([1], None, [1, 2], 2, medium="CPU"),
                stored_v3([2], None, [3, 4], 2, group_idx=1),
                stored_v3([3], None, [5, 6], 2, medium=None, group_idx=0),
                BlockRemovedV3([9], "cpu"),
                BlockRemovedV3([8], "GPU", group_idx=1),
                stored_v3([4], None, [7, 8], 2, medium="disk"),
                stored_v3([5], None, [7, 8], 2, medium="NVME_REMOTE"),  # a tier we do not know
            ],
        )
    )
    batch = decode_batch(payload)
    assert batch.events == (
        BlockStored((1,), None, (1, 2), 2, medium="CPU"),
        BlockStored((3,), None, (5, 6), 2),
        BlockRemoved((9,), medium="CPU"),
        BlockStored((4,), None, (7, 8), 2, medium="DISK"),
    )
    assert batch.skipped == 3
    other_group = decode_batch(payload, DecodeOptions(kv_group=1))
    # events without a group are every group's
    assert [e.block_hashes for e in other_group.events] == [(1,), (2,), (9,), (8,), (4,)]  # type: ignore[union-attr]


def test_lora_name_from_event_or_from_loaded_adapter_ids() -> None:
    names = {7: "sql-adapter"}
    payload = encode(
        KVEventBatchV3(
            ts=0.0,
            events=[
                stored_v3([1], None, [1, 2], 2, lora_id=7),  # old: id only
                stored_v3([2], None, [1, 2], 2, lora_id=3, lora_name="named"),  # name wins
                stored_v3([3], None, [1, 2], 2, lora_id=99),  # unknown id: skipped
                stored_v3([4], None, [1, 2], 2, lora_id=0),  # 0: no adapter
            ],
        )
    )
    batch = decode_batch(payload, DecodeOptions(lora_names=names))
    assert [(e.block_hashes, e.lora_name) for e in batch.events] == [  # type: ignore[union-attr]
        ((1,), "sql-adapter"),
        ((2,), "named"),
        ((4,), None),
    ]
    assert batch.skipped == 1


class BlockUpdatedV3(msgspec.Struct, omit_defaults=True, gc=False, tag="BlockUpdated"):
    block_hashes: list[int]


class FutureBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStoredV3 | BlockUpdatedV3 | AllBlocksClearedV3]
    data_parallel_rank: int | None = None


def test_event_types_the_translation_does_not_know_are_skipped_and_counted() -> None:
    """A release that declares an event type we do not translate: its other events pass."""
    payload = encode(FutureBatch(0.0, [BlockUpdatedV3([1]), AllBlocksClearedV3()]))
    batch = BatchReader(FutureBatch).decode(payload)
    assert batch.events == (AllBlocksCleared(),)
    assert batch.skipped == 1


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",  # not msgpack
        _pack("batch"),
        _pack([1.0]),  # no events
        _pack({"events": []}),  # a map where the release sends an array
        _pack(["now", []]),  # ts not a number
        _pack([1.0, "events"]),
        _pack([1.0, [[1, 2]]]),  # an array where the release sends a map
        _pack([1.0, [{"block_hashes": [1]}]]),  # an event without its "type"
        _pack([1.0, [{"type": "BlockUpdated", "block_hashes": [1]}]]),  # not this release's
        _pack([1.0, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
                      "token_ids": [1, 2]}]]),  # block_size missing
        _pack([1.0, [{"type": "BlockRemoved", "medium": "GPU"}]]),  # block_hashes missing
        _pack([1.0, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
                      "token_ids": [1.5, 2], "block_size": 2, "lora_id": None,
                      "medium": "GPU", "lora_name": None}]]),  # a token id not an int
        _pack([1.0, [{"type": "BlockRemoved", "block_hashes": "abc", "medium": None}]]),
    ],
)  # fmt: skip
def test_payloads_the_release_would_not_send_raise(payload: bytes) -> None:
    with pytest.raises(VllmKvDecodeError):
        decode_batch(payload)


# --------------------------------------------------------------------------------- frames
def test_pub_frames() -> None:
    assert parse_pub_frames([b"kv-events", (5).to_bytes(8, "big"), b"x"]) == (5, b"x")
    with pytest.raises(VllmKvDecodeError):
        parse_pub_frames([b"kv-events", b"x"])
    with pytest.raises(VllmKvDecodeError):
        parse_pub_frames([b"kv-events", b"\x00\x01", b"x"])


@pytest.mark.parametrize(
    ("frames", "expected"),
    [
        ([b"", (3).to_bytes(8, "big"), b"p"], (3, b"p")),  # before vLLM 0.26
        ([b"", (-1).to_bytes(8, "big", signed=True), b""], None),  # its END_SEQ
        ([b"", b"kv", (3).to_bytes(8, "big"), b"p"], (3, b"p")),  # 0.26 and later: topic
        ([b"", b"", (-1).to_bytes(8, "big", signed=True), b""], None),  # their end marker
        ([b"", (9).to_bytes(8, "big"), b""], None),  # empty payload ends too
    ],
)
def test_replay_frames(frames: list[bytes], expected: tuple[int, bytes] | None) -> None:
    assert parse_replay_frames(frames) == expected


@pytest.mark.parametrize(
    "frames",
    [
        [(3).to_bytes(8, "big"), b"p"],  # no ROUTER delimiter
        [b"x", (3).to_bytes(8, "big"), b"p"],
        [b"", b"\x00\x01", b"p"],  # a sequence number of 2 bytes
        [b"", b"kv", b"topic2", (3).to_bytes(8, "big"), b"p"],
    ],
)
def test_replay_frames_of_no_release_are_refused(frames: list[bytes]) -> None:
    with pytest.raises(VllmKvDecodeError):
        parse_replay_frames(frames)


def test_replay_request_is_what_vllms_router_expects() -> None:
    # The ROUTER sees [identity, b"", start] and reads int.from_bytes(start, "big").
    delimiter, start = replay_request(300)
    assert delimiter == b""
    assert int.from_bytes(start, "big") == 300 and len(start) == 8


@pytest.mark.parametrize(
    ("seqs", "start", "stop", "expected"),
    [
        ([3, 4, 5, 6, 7], 4, 6, [4, 5]),  # vLLM sends everything from start on
        ([4, 5], 4, 6, [4, 5]),
        ([5, 6], 4, 6, None),  # 4 fell out of vLLM's buffer
        ([4, 6], 4, 7, None),
        ([], 4, 5, None),
    ],
)
def test_fill_gap(seqs: list[int], start: int, stop: int, expected: list[int] | None) -> None:
    filled = fill_gap([(s, bytes([s])) for s in seqs], start, stop)
    assert (None if filled is None else [s for s, _ in filled]) == expected
    if filled is not None:
        assert all(p == bytes([s]) for s, p in filled)


def test_sequence_tracker() -> None:
    t = SequenceTracker()
    assert t.check(0).kind is SeqKind.NEXT
    t.applied(0)
    assert t.check(1).kind is SeqKind.NEXT
    t.applied(1)
    gap = t.check(5)
    assert (gap.kind, gap.missing_from) == (SeqKind.GAP, 2)
    t.applied(5)
    assert t.check(3).kind is SeqKind.DUPLICATE
    assert t.check(0).kind is SeqKind.RESTART
    late = SequenceTracker()  # first message seen is not 0: what came before is missing
    assert (late.check(4).kind, late.check(4).missing_from) == (SeqKind.GAP, 0)


# ------------------------------------------------------------------------ the indexer's view
def test_decoded_events_translate_to_fleet_hashes() -> None:
    """What the worker's relay does with the events: fleet hashes recomputed from token ids,
    chained across events through the engine's parent hash, equal to the router's prompt
    hashes."""
    digests = [bytes([i]) * 32 for i in range(1, 4)]
    payload = encode(
        KVEventBatchV3(
            ts=0.0,
            events=[
                stored_v3(digests[:2], None, TOKENS[:4], 2),
                stored_v3(digests[2:], digests[1], TOKENS[4:], 2),
            ],
        )
    )
    decoded = decode_batch(payload)
    relay = KvRelay(False, 4)
    out = relay.relay(decoded.events)
    assert relay.dropped_runs == 0
    fleet = [h for ev in out if isinstance(ev, BlockStored) for h in ev.block_hashes]
    assert fleet == fleet_hashes_for_prompt(TOKENS, 2)
    engine = [h for ev in decoded.events if isinstance(ev, BlockStored) for h in ev.block_hashes]
    assert engine == [engine_block_hash(d) for d in digests]


@pytest.mark.parametrize(
    ("extra_keys", "lora_name", "kept"),
    [
        (None, None, True),
        ([None, None], None, True),
        ([("sql",), ("sql",)], "sql", True),  # only the LoRA name: hashed like our prompts
        ([None, (("img-1", 0),)], None, False),  # a multimodal input in the second block
        ([("salt-a",), None], None, False),  # a cache salt
        ([("sql", "salt-a"), None], "sql", False),
    ],
)
def test_blocks_hashed_over_more_than_tokens_are_skipped(
    extra_keys: list[Any] | None, lora_name: str | None, kept: bool
) -> None:
    event = stored_v3([1, 2], None, [1, 2, 3, 4], 2, lora_name=lora_name, extra_keys=extra_keys)
    decoded = decode_batch(encode(KVEventBatchV3(1.0, [event], 0)))
    assert (len(decoded.events), decoded.skipped) == ((1, 0) if kept else (0, 1))
