from __future__ import annotations

import pytest

from schemas.trace import child_traceparent, parse_traceparent

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_valid_traceparent_is_continued_with_a_new_span() -> None:
    assert parse_traceparent(VALID) == ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
    trace_id, header = child_traceparent(VALID)
    assert trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert parse_traceparent(header) is not None and header != VALID


@pytest.mark.parametrize(
    "bad",
    [None, "", "garbage", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
     "00-00000000000000000000000000000000-00f067aa0ba902b7-01"],
)  # fmt: skip
def test_anything_else_starts_a_new_trace(bad: str | None) -> None:
    assert parse_traceparent(bad) is None
    trace_id, header = child_traceparent(bad)
    assert len(trace_id) == 32 and parse_traceparent(header) == (trace_id, header[36:52])
