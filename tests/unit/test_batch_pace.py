"""The batch pace: lines in flight follow the interactive latency and the event loop's lag."""

from __future__ import annotations

import pytest

from router.frontend.batch_pace import BatchPace


def window(pace: BatchPace, ms: float = 60.0, n: int = 40, quiet: bool = False) -> int:
    for i in range(n):
        pace.ttft((ms + i % 5) / 1000, quiet)
    pace.lag(1.0)
    return pace.window()


def quiet_pace(**kw: float) -> BatchPace:
    pace = BatchPace(**kw)  # type: ignore[arg-type]
    for _ in range(2):
        pace.ttft(0.060, True)
    window(pace, quiet=True)  # the quiet p90: 64 ms
    return pace


def test_slow_start_doubles_to_the_ceiling() -> None:
    pace = quiet_pace(ceiling=16)
    assert pace.lines == 2
    assert [window(pace) for _ in range(5)] == [4, 8, 16, 16, 16]


def test_interactive_latency_above_the_quiet_level_halves_then_adds_one() -> None:
    pace = quiet_pace(ceiling=16, slack=0.1)
    for _ in range(4):
        window(pace)
    assert pace.lines == 16
    assert window(pace, ms=66.0) == 16  # p90 70 ms: within 10% of 64
    assert window(pace, ms=90.0) == 8  # the last three windows' p90 is 94 ms: in the way
    assert window(pace, ms=90.0) == 4  # judged again on the new limit's own samples
    assert window(pace) == 5  # no slow start once cut: one more a window
    assert window(pace) == 6


def test_event_loop_lag_halves_without_any_interactive_request() -> None:
    pace = BatchPace(ceiling=8, lag_ms=25.0)
    for _ in range(3):
        pace.window()
    assert pace.lines == 8
    pace.lag(40.0)
    assert pace.window() == 4
    pace.lag(10.0)
    assert pace.window() == 5


def test_too_few_samples_are_no_signal_and_the_floor_is_none() -> None:
    pace = quiet_pace(ceiling=4, min_samples=30, judge_windows=1)
    window(pace, ms=500.0, n=10)  # ten slow requests are not enough to judge
    assert pace.lines == 4
    for _ in range(4):
        window(pace, ms=500.0)
    assert pace.lines == 0  # the batch waits
    assert window(pace) == 1  # a quiet window lets one line in again


def test_without_quiet_samples_it_probes_at_the_quiet_lines() -> None:
    pace = BatchPace(ceiling=8, quiet_lines=1, probe_windows=2, baseline_windows=10)
    for _ in range(3):
        pace.window()  # no interactive traffic: slow start to 8
    assert pace.lines == 8
    assert window(pace) == 1  # traffic but nothing quiet to judge it by: probe
    assert window(pace, quiet=True) == 1
    assert window(pace, quiet=True) == 8  # back where it was, now with a baseline
    assert pace.baseline() == pytest.approx(0.064)
    for _ in range(10):
        window(pace)  # the quiet samples age out of baseline_windows
    assert pace.baseline() is None
    assert window(pace) == 1


def test_a_ceiling_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        BatchPace(ceiling=0)
