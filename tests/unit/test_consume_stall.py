"""The stall judge: a consume is stalled only when its position stands still with work there."""

from __future__ import annotations

import pytest

from router.consume_stall import Look, StallJudge


def look(at: float, applied: int = 5, waiting: int = 0, busy=None, pending=0) -> Look:
    return Look(at, applied, waiting, busy, pending)


@pytest.mark.parametrize(
    ("seen", "want"),
    [
        (look(40.0), None),  # idle: nothing anywhere, however long
        (look(40.0, busy=2.0), None),  # a step running, but a short one
        (look(40.0, busy=31.0), "step"),
        (look(40.0, waiting=3), "untaken"),
        (look(40.0, pending=None), "gone"),
        (look(40.0, pending=12), "undelivered"),
        (look(20.0, pending=12), None),  # not long enough yet
        (look(40.0, applied=6, pending=12), None),  # it just moved
    ],
)
def test_verdicts(seen: Look, want: str | None) -> None:
    judge = StallJudge(after_s=30.0)
    judge.quiet_for(0.0, 5)  # position 5 seen at t=0
    assert judge.verdict(seen) == want


def test_the_clock_starts_again_when_the_position_moves() -> None:
    judge = StallJudge(after_s=10.0)
    assert not judge.due(0.0, 1)
    assert not judge.due(9.0, 1)
    assert judge.due(10.0, 1)
    assert not judge.due(11.0, 2)  # moved at 11
    assert not judge.due(20.0, 2)
    assert judge.due(21.0, 2)
    assert judge.verdict(look(21.0, applied=2, pending=1)) is not None
