"""Property-based fuzz of the wire (hypothesis): whatever bytes arrive on a subject, decoding
gives the struct or a ``WireDecodeError`` (the consumer dead-letters it), never another
exception; and the validator judges every decodable ``Request`` without raising."""

from __future__ import annotations

import contextlib

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import (
    CancelRequested,
    KvEventBatch,
    Request,
    RequestObservation,
    ScalingDecided,
    TokenChunk,
    WireDecodeError,
    WorkerLoad,
    WorkerRegistration,
    decode,
)
from schemas.validate import request_problem

STRUCTS = (
    Request,
    TokenChunk,
    KvEventBatch,
    WorkerLoad,
    WorkerRegistration,
    RequestObservation,
    ScalingDecided,
    CancelRequested,
)

json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=30,
)


def _packable(value: object) -> bytes | None:
    try:
        return msgspec.msgpack.encode(value)
    except (TypeError, OverflowError, ValueError):
        return None


@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=st.binary(max_size=200), typ=st.sampled_from(STRUCTS))
def test_any_bytes_decode_or_raise_the_wire_error(data: bytes, typ: type) -> None:
    with contextlib.suppress(WireDecodeError):
        decode(data, typ)


def _request_like() -> st.SearchStrategy[dict[str, object]]:
    """Mostly-well-formed requests: the real field names with hostile values."""
    fields = {
        "request_id": st.text(max_size=40) | json_like,
        "model": st.text(max_size=40) | json_like,
        "token_ids": st.lists(st.integers(min_value=-(2**40), max_value=2**40), max_size=20)
        | json_like,
        "sampling": st.dictionaries(
            st.sampled_from(["max_tokens", "temperature", "seed", "stop", "logprobs", "n"]),
            json_like,
        )
        | json_like,
        "attempt": st.integers(min_value=-5, max_value=2**40) | json_like,
        "v": st.integers(min_value=-1, max_value=9),
    }
    return st.fixed_dictionaries({}, optional=fields)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(body=_request_like() | st.dictionaries(st.text(max_size=10), json_like), vocab=st.none()
       | st.integers(min_value=1, max_value=300))  # fmt: skip
def test_decodable_requests_are_judged_without_raising(body: object, vocab: int | None) -> None:
    data = _packable(body)
    if data is None:
        return
    try:
        req = decode(data, Request)
    except WireDecodeError:
        return
    problem = request_problem(req, vocab)
    assert problem is None or isinstance(problem, str)
