"""The stall judge: a consume is stalled only when work has waited ``after_s`` with its position
standing still all along; an idle consume never is."""

from __future__ import annotations

import pytest

from router.consume_stall import MAX_BACKOFF, Look, StallJudge, stall_after


def look(at: float, applied: int = 5, waiting: int = 0, busy: bool = False, pending=0) -> Look:
    return Look(at, applied, waiting, busy, pending)


@pytest.mark.parametrize(
    ("work", "want"),
    [
        ({"busy": True, "waiting": 3, "pending": 9}, "step"),  # the loop in a step, first
        ({"waiting": 3, "pending": 9}, "untaken"),
        ({"pending": None}, "gone"),
        ({"pending": 12}, "undelivered"),
        ({}, None),  # idle: nothing anywhere, however long
    ],
)
def test_work_that_waits_after_s_with_the_position_still_is_a_stall(work, want) -> None:
    judge = StallJudge(after_s=30.0)
    assert judge.verdict(look(0.0, **work)) is None  # the clock starts
    assert judge.verdict(look(29.0, **work)) is None
    assert judge.verdict(look(30.0, **work)) == want


def test_an_idle_spell_does_not_count_toward_the_next_burst() -> None:
    """Idle for 40 s, then messages arrive: the first look that sees them (before the loop has
    moved the position) starts the clock, it does not find 40 s already waited."""
    judge = StallJudge(after_s=30.0)
    for t in range(0, 41):
        assert judge.verdict(look(float(t))) is None
    assert judge.verdict(look(41.0, pending=200)) is None
    assert judge.verdict(look(42.0, waiting=100, busy=True)) is None
    assert judge.waited_s(42.0) == 1.0


def test_the_clock_starts_again_when_the_position_moves_or_the_work_is_done() -> None:
    judge = StallJudge(after_s=10.0)
    assert judge.verdict(look(0.0, pending=5)) is None
    assert judge.verdict(look(9.0, applied=6, pending=5)) is None  # moved at 9
    assert judge.verdict(look(18.0, applied=6, pending=5)) is None
    assert judge.verdict(look(19.0, applied=6, pending=5)) == "undelivered"
    judge = StallJudge(after_s=10.0)
    assert judge.verdict(look(0.0, pending=5)) is None
    assert judge.verdict(look(5.0)) is None  # nothing waits: no clock
    assert judge.verdict(look(6.0, pending=5)) is None
    assert judge.verdict(look(15.0, pending=5)) is None
    assert judge.verdict(look(16.0, pending=5)) == "undelivered"


def test_a_consume_restarted_in_a_row_is_given_longer_each_time() -> None:
    assert [stall_after(30.0, n) for n in range(5)] == [30.0, 60.0, 120.0, 240.0, 240.0]
    assert stall_after(30.0, 99) == 30.0 * MAX_BACKOFF
