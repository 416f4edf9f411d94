"""``jetfleet up --workers-per-process K``: how workers are packed into processes, and when
packing is refused."""

from __future__ import annotations

import pytest

from infra.cli import fleet, parse_args
from infra.up import worker_packs
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
        (["--workers-per-process", "0", "--no-planner"], "at least 1"),
    ],
)  # fmt: skip
def test_packing_refused_before_anything_starts(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # (not ``main``: it configures logging for the whole test process)
    args = parse_args(["up", *argv])
    assert fleet.run(args, Subjects(), lambda coro: pytest.fail("nothing may run")) == 2
    assert says in capsys.readouterr().err
