"""The chaos checker's verdicts (tests/chaos/checker.py), case by case: it must tell a complete
answer from a repeated, interleaved, truncated or hung one, whatever path the request took."""

from __future__ import annotations

import pytest

from tests.chaos.checker import Trace, attempts_interleaved, judge, verdict

REF_HTTP = ["ab", "cd", "ef"]
REF_NATS = [1, 2, 3, 4]


def _trace(kind: str = "http", **kw: object) -> Trace:
    base: dict[str, object] = {"accepted_at": 1.0, "ended_at": 3.0, "end": "finish:length"}
    base.update(kw)
    return Trace("r1", kind, 0, 0.5, **base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("trace", "expected"),
    [
        (_trace(output=["ab", "cd", "ef"]), "completed"),
        (_trace(output=["abc", "def"]), "completed"),  # pieces cut differently, same text
        (_trace(output=["ab", "cd", "cd", "ef"]), "duplicated"),  # a piece repeated
        (_trace(output=["ab", "cd", "ef", "ef"]), "duplicated"),  # longer than the answer
        (_trace(output=["ab", "cd"]), "lost"),  # a finish with tokens missing
        (_trace(output=["ab"], end="cut:ReadError"), "lost"),  # stream cut off, no error
        (_trace(output=["ab"], ended_at=0.0, end=""), "lost"),  # never ended: a hang
        (_trace(output=["ab"], end="error:worker lost"), "clear_error"),
        (_trace(accepted_at=0.0, end="refused:503"), "refused"),
        (_trace(output=["ab", "cd", "ef"], interleaved=True), "duplicated"),
        (_trace("nats", output=[1, 2, 3, 4]), "completed"),
        (_trace("nats", output=[1, 2, 2, 3, 4]), "duplicated"),
        (_trace("nats", output=[1, 2, 4, 3]), "duplicated"),  # spliced out of order
        (_trace("nats", output=[1, 2, 3]), "lost"),
    ],
)
def test_verdicts(trace: Trace, expected: str) -> None:
    ref = REF_HTTP if trace.kind == "http" else REF_NATS
    assert verdict(trace, ref) == expected


def test_attempts_interleaved_reads_the_stream_order() -> None:
    stream = [("a", 0), ("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 0), ("b", 1), ("c", 2)]
    assert attempts_interleaved(stream) == {"a"}


def test_judge_counts_each_request_once_and_the_longest_stall() -> None:
    traces = [
        _trace(output=REF_HTTP, arrivals=[1.5, 2.0, 2.5]),
        _trace(output=["ab"], end="error:x", arrivals=[1.2]),
        _trace(accepted_at=0.0, end="refused:503"),
        _trace(output=["ab"], ended_at=0.0, end="", arrivals=[1.1]),  # hung since 1.1
    ]
    row, by = judge("f", traces, {("http", 0): REF_HTTP}, now=11.1)
    assert (row.requests, row.accepted, row.completed) == (4, 3, 1)
    assert (row.clear_errors, row.refused, row.lost, row.duplicated) == (2, 1, 1, 0)
    assert row.longest_stall_s == pytest.approx(10.0)
    assert sum(len(v) for v in by.values()) == 4
