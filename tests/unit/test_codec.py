"""Wire codec (``schemas.codec``): every struct round-trips; bad payloads raise WireDecodeError."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

import schemas
from schemas import (
    AllBlocksCleared,
    BlockRemoved,
    BlocksSnapshot,
    BlockStored,
    CancelRequested,
    ControlReply,
    ControlRequest,
    DeadLetter,
    HeldRequests,
    IndexSnapshot,
    KvEventBatch,
    ModelCard,
    Request,
    RequestObservation,
    RouteCandidate,
    RouteDecision,
    SamplingParams,
    ScalingDecided,
    ScalingStatus,
    ShapeChanged,
    SlotTableSnapshot,
    StructuredOutput,
    TokenChunk,
    TokenLogprob,
    Usage,
    WireDecodeError,
    WorkerLoad,
    WorkerRegistration,
    decode,
    encode,
    to_builtins,
    to_json,
)

ROUTE = RouteDecision(
    policy="kv",
    worker_id="w1",
    candidates=(RouteCandidate("w1", overlap_blocks=3, load=0.5, cost=1.25), RouteCandidate("w2")),
    decision_us=42.0,
)
REQUEST = Request(
    request_id="r1",
    model="org/Model-1.5B",
    token_ids=(1, 2, 3, 1 << 31),
    sampling=SamplingParams(max_tokens=16, temperature=0.0, seed=7, stop_token_ids=(2,)),
    attempt=1,
    num_generated_before=2,
    created_at_s=1.5,
    lora_name="lora-a",
    route=ROUTE,
    kv_transfer_params={"remote": "w9", "blocks": [1, 2]},
)
BATCH = KvEventBatch(
    worker_id="w1",
    model="m",
    event_id=7,
    ts_s=1.0,
    events=(
        BlockStored((1,), None, (1, 2), 2, lora_name="l"),
        BlockRemoved((1,)),
        AllBlocksCleared(),
    ),
)
FINAL_CHUNK = TokenChunk(
    "r1", 0, 0, (1, 2), "hi", "stop", Usage(3, 2, cached_tokens=1), worker_id="w1"
)

SAMPLES: list[msgspec.Struct] = [
    SlotTableSnapshot("m", {"w1": 0, "w1 CPU": 1}, 3),
    BlocksSnapshot("m", 2, b"\x00" * 16, (b"\x80", b"\xc0\x01"), b"\x80"),
    IndexSnapshot(1.0, 3, ({"0": 42}, {}, {"0": 41, "1": 7}), parts=("part-1-m-0",)),
    ShapeChanged(False, "CPU"),
    ControlRequest(args={"lora": "a"}),
    ControlRequest(),
    ControlReply(ok=True, detail="fine", data={"loras": ["a", "b"], "n": 2}),
    DeadLetter("indexer", "fleet.kv.m.w1", "undecodable", 3.5, b"\x00\xff", {"Nats-Msg-Id": "x"}),
    WorkerRegistration("w1", "m", "decode", "mocker", 8, 1024, 16, heartbeat_at_s=2.0, pid=9),
    ModelCard("m", 4096, 16, "tok.json", "ab" * 32, "{{ x }}", "<s>", "</s>", (2, 3), 1.0),
    BlockStored(block_hashes=(1, 2), parent_block_hash=None, token_ids=(5,) * 32, block_size=16),
    BlockStored((3,), parent_block_hash=(1 << 64) - 1, token_ids=(1,) * 4, block_size=4),
    BlockRemoved(block_hashes=(1, 2)),
    AllBlocksCleared(),
    BATCH,
    WorkerLoad("w1", "m", "agg", 1.0, 2, 3, 8, 0.25, 1024, active_decode_blocks=5),
    HeldRequests("frontend-1", "m", 1.0, {"agg": 3, "decode": 1}),
    RequestObservation("r1", "m", "ok", 2.0, worker_id="w1", ttft_s=0.1, route=ROUTE),
    SamplingParams(max_tokens=1),
    RouteCandidate("w1"),
    ROUTE,
    REQUEST,
    CancelRequested("r1"),
    ScalingDecided("m", "decode", 3, 1.0, 1, 2, reasons=("ttft",), dry_run=True),
    ScalingStatus("m", "decode", 3, 1.0, "local", "applied", replicas=2),
    FINAL_CHUNK,
    TokenChunk("r1", 1, 5, error="boom", finish_reason="error"),
    Usage(prompt_tokens=3, completion_tokens=0),
    StructuredOutput(json_schema='{"type": "object"}'),
    StructuredOutput(choice=("yes", "no")),
    SamplingParams(
        max_tokens=4, logprobs=2, prompt_logprobs=0, structured=StructuredOutput(regex="a+")
    ),
    TokenLogprob(-0.5, (7, 9), (-0.5, -1.5)),
    TokenChunk(
        "r1",
        0,
        1,
        (7,),
        logprobs=(TokenLogprob(-0.5, (7,), (-0.5,)),),
        prompt_logprobs=(None, TokenLogprob(-2.0)),
    ),
]


def _exported_struct_types() -> set[type]:
    exported = (getattr(schemas, name) for name in schemas.__all__)
    return {t for t in exported if isinstance(t, type) and issubclass(t, msgspec.Struct)}


def test_samples_cover_every_exported_struct() -> None:
    assert _exported_struct_types() <= {type(s) for s in SAMPLES}


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg: msgspec.Struct) -> None:
    data = encode(msg)
    assert isinstance(data, bytes)
    assert decode(data, type(msg)) == msg


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_json_for_humans(msg: msgspec.Struct) -> None:
    as_json = json.loads(to_json(msg))
    assert as_json == json.loads(json.dumps(to_builtins(msg)))


def test_kv_events_are_tagged() -> None:
    kinds = [e["type"] for e in to_builtins(BATCH)["events"]]
    assert kinds == ["stored", "removed", "cleared"]


def test_defaults_are_omitted_on_the_wire() -> None:
    assert len(encode(TokenChunk("r1", 0, 0))) < len(encode(FINAL_CHUNK))
    assert msgspec.msgpack.decode(encode(CancelRequested("r1"))) == {"request_id": "r1"}


@pytest.mark.parametrize(
    "garbage",
    [b"", b"\xc1", b"\xff\xff\xff", b"not msgpack at all", b"\x93\x01\x02"],
    ids=["empty", "reserved-byte", "truncated", "text", "array"],
)
@pytest.mark.parametrize("typ", [Request, TokenChunk, KvEventBatch, WorkerRegistration])
def test_garbage_raises_wire_decode_error(garbage: bytes, typ: type) -> None:
    with pytest.raises(WireDecodeError):
        decode(garbage, typ)


_BATCH_HEAD = {"worker_id": "w", "model": "m", "event_id": 1, "ts_s": 0.0}
_REGISTRATION = {
    "worker_id": "w1",
    "model": "m",
    "engine": "e",
    "max_num_seqs": 1,
    "num_gpu_blocks": 1,
    "block_size": 1,
}


@pytest.mark.parametrize(
    ("payload", "typ"),
    [
        (encode(TokenChunk("r1", 0, 0)), Request),  # another struct: fields missing
        (encode(REQUEST), TokenChunk),
        ({"request_id": 5, "attempt": 0, "index": 0}, TokenChunk),  # wrong field type
        ({"request_id": "r", "attempt": "zero", "index": 0}, TokenChunk),
        ({**_BATCH_HEAD, "events": [{"x": 1}]}, KvEventBatch),  # untagged event
        ({**_BATCH_HEAD, "events": [{"type": "moved"}]}, KvEventBatch),  # unknown tag
        ({**_REGISTRATION, "role": "boss"}, WorkerRegistration),  # outside the Literal
        ([1, 2, 3], CancelRequested),
        ("r1", CancelRequested),
    ],
)
def test_wrong_types_raise_wire_decode_error(payload: Any, typ: type) -> None:
    data = payload if isinstance(payload, bytes) else msgspec.msgpack.encode(payload)
    with pytest.raises(WireDecodeError, match=typ.__name__):
        decode(data, typ)


@pytest.mark.parametrize(
    "msg",
    [s for s in SAMPLES if "v" in type(s).__struct_fields__],
    ids=lambda m: type(m).__name__,
)
def test_newer_schema_version_is_refused(msg: msgspec.Struct) -> None:
    version = msg.v + 1  # type: ignore[attr-defined]
    newer = msgspec.structs.replace(msg, v=version)  # type: ignore[call-arg]
    with pytest.raises(WireDecodeError, match=f"version {version}"):
        decode(encode(newer), type(msg))


def test_wire_decode_error_is_a_value_error() -> None:
    assert issubclass(WireDecodeError, ValueError)
