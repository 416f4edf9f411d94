"""The wire validator: each kind of poison the fleet has met is named, valid requests pass."""

from __future__ import annotations

import msgspec
import pytest

from schemas import Request, SamplingParams
from schemas.validate import is_subject_token, request_problem

OK = Request("req-1", "m", (1, 2, 3), SamplingParams(max_tokens=4))


def test_a_valid_request_passes() -> None:
    assert request_problem(OK) is None
    assert request_problem(OK, vocab_size=4) is None


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"request_id": "a.b"}, "request_id"),
        ({"request_id": "has space"}, "request_id"),
        ({"request_id": "x" * 300}, "request_id"),
        ({"request_id": ""}, "request_id"),
        ({"model": ""}, "model"),
        ({"token_ids": ()}, "empty"),
        ({"token_ids": (1, -1)}, "token ids"),
        ({"token_ids": (1, 2**32)}, "token ids"),
        ({"sampling": SamplingParams(max_tokens=0)}, "max_tokens"),
        ({"sampling": SamplingParams(max_tokens=-5)}, "max_tokens"),
        ({"sampling": SamplingParams(max_tokens=4, top_p=0.0)}, "top_p"),
        ({"sampling": SamplingParams(max_tokens=4, temperature=-1.0)}, "temperature"),
        ({"attempt": -1}, "attempt"),
        ({"num_generated_before": 10}, "num_generated_before"),
    ],
)
def test_each_poison_is_named(change: dict, problem: str) -> None:
    bad = msgspec.structs.replace(OK, **change)
    found = request_problem(bad)
    assert found is not None and problem in found


def test_token_ids_outside_the_models_vocabulary() -> None:
    found = request_problem(OK, vocab_size=3)
    assert found is not None and "[0, 3)" in found


@pytest.mark.parametrize("value", ["cmpl-abc_1:2", "A" * 256])
def test_subject_tokens(value: str) -> None:
    assert is_subject_token(value)


# ---------------------------------------------- every bound, on both sides, with its message
MAX = 2**31 - 1


def _sp(**kw: object) -> SamplingParams:
    return SamplingParams(**({"max_tokens": 4} | kw))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"request_id": "x"}, None),
        ({"request_id": "x" * 256}, None),
        ({"request_id": "x" * 257}, "request_id must be 1-256 characters of [A-Za-z0-9_-:]"),
        ({"request_id": "aZ09_-:"}, None),
        ({"model": "m" * 256}, None),
        ({"model": "m" * 257}, "model must be a non-empty name"),
        ({"token_ids": ()}, "token_ids is empty"),
        ({"token_ids": (0, MAX)}, None),
        ({"token_ids": (0, MAX + 1)}, f"token ids must be in [0, {MAX + 1}), got [0, {MAX + 1}]"),
        ({"token_ids": (-1, 5)}, f"token ids must be in [0, {MAX + 1}), got [-1, 5]"),
        ({"num_generated_before": 3}, None),
        (
            {"num_generated_before": 4},
            "attempt and num_generated_before must be >= 0 (and within token_ids)",
        ),
        ({"attempt": -1}, "attempt and num_generated_before must be >= 0 (and within token_ids)"),
        ({"sampling": _sp(max_tokens=1)}, None),
        ({"sampling": _sp(max_tokens=0)}, "max_tokens must be >= 1, got 0"),
        ({"sampling": _sp(temperature=0.0)}, None),
        ({"sampling": _sp(temperature=0.5)}, None),
        ({"sampling": _sp(temperature=100.0)}, None),
        ({"sampling": _sp(temperature=100.5)}, "temperature out of range: 100.5"),
        ({"sampling": _sp(temperature=-0.1)}, "temperature out of range: -0.1"),
        ({"sampling": _sp(top_p=1.0)}, None),
        ({"sampling": _sp(top_p=1.5)}, "top_p must be in (0, 1], got 1.5"),
        ({"sampling": _sp(top_p=0.0)}, "top_p must be in (0, 1], got 0.0"),
        ({"sampling": _sp(top_k=-1)}, "top_k and min_tokens must be >= 0 and min_p in [0, 1]"),
        ({"sampling": _sp(min_tokens=-1)}, "top_k and min_tokens must be >= 0 and min_p in [0, 1]"),
        ({"sampling": _sp(min_p=1.0)}, None),
        ({"sampling": _sp(min_p=0.0)}, None),
        ({"sampling": _sp(min_p=1.5)}, "top_k and min_tokens must be >= 0 and min_p in [0, 1]"),
        ({"sampling": _sp(repetition_penalty=0.0)}, "repetition_penalty must be > 0, got 0.0"),
        ({"sampling": _sp(repetition_penalty=0.01)}, None),
        ({"sampling": _sp(stop_token_ids=(0, MAX))}, None),
        ({"sampling": _sp(stop_token_ids=(MAX + 1,))}, "stop_token_ids out of range"),
        ({"sampling": _sp(stop_token_ids=(-1,))}, "stop_token_ids out of range"),
    ],
)
def test_each_bound_and_its_message(change: dict[str, object], message: str | None) -> None:
    req = msgspec.structs.replace(OK, **change)
    assert request_problem(req) == message


def test_a_vocab_bounds_token_ids_exactly() -> None:
    assert request_problem(msgspec.structs.replace(OK, token_ids=(0, 3)), vocab_size=4) is None
    assert request_problem(msgspec.structs.replace(OK, token_ids=(4,)), vocab_size=4) == (
        "token ids must be in [0, 4), got [4, 4]"
    )
