"""``jetfleet up --workers-per-process K``: how workers are packed into processes, and when
packing is refused."""

from __future__ import annotations

import pytest

from infra.cli import fleet, parse_args
from infra.packing import auto_per_process, worker_packs
from schemas import Subjects


@pytest.mark.parametrize(
    ("workers", "per_process", "packs"),
    [
        (2, 1, [1, 1]),
        (1024, 256, [256] * 4),
        (1024, 1024, [1024]),
        (10, 4, [4, 3, 3]),
        (5, 2, [2, 2, 1]),
        (3, 8, [3]),
        (0, 4, []),
    ],
)
def test_worker_packs(workers: int, per_process: int, packs: list[int]) -> None:
    assert worker_packs(workers, per_process) == packs


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--workers-per-process", "2"], "needs --no-planner"),
        (["--workers-per-process", "2", "--no-planner", "--engine", "vllm", "--model", "."],
         "mocker workers only"),
        (["--workers", "1024"], "--no-planner packs them"),
    ],
)  # fmt: skip
def test_packing_refused_before_anything_starts(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # (not ``main``: it configures logging for the whole test process)
    args = parse_args(["up", *argv])
    assert fleet.run(args, Subjects(), lambda coro: pytest.fail("nothing may run")) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("workers", "cores", "one_per_process", "per_process"),
    [
        (2, 2, False, 1),  # a small fleet: a process each
        (63, 2, False, 1),
        (64, 2, False, 32),  # from 64: as many processes as cores
        (1024, 2, False, 256),  # 4 of 256
        (1000, 2, False, 250),
        (1024, 16, False, 64),  # every core busy
        (100, 200, False, 1),  # more cores than workers
        (1024, 2, True, 1),  # the planner's connector, or a real engine
    ],
)
def test_auto_packing(workers: int, cores: int, one_per_process: bool, per_process: int) -> None:
    assert auto_per_process(workers, cores, one_per_process) == per_process


def test_up_packs_a_large_fixed_fleet_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    import infra.up

    seen: list[int] = []
    monkeypatch.setattr(infra.up, "run_up", lambda a, _s: seen.append(a.workers_per_process) or 0)
    monkeypatch.setattr(fleet.os, "cpu_count", lambda: 2)
    for argv in (["--workers", "1024", "--no-planner"], ["--workers", "4", "--no-planner"]):
        assert fleet.run(parse_args(["up", *argv]), Subjects(), lambda c: None) == 0
    assert seen == [256, 1]


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_a_packing_that_is_not_a_count_is_refused_by_the_parser(value: str) -> None:
    with pytest.raises(SystemExit):
        parse_args(["up", "--workers-per-process", value])
