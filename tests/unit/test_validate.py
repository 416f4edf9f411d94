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
