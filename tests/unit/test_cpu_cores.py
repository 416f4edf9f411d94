"""The cores each CPU engine runs on: CPU lists, how ``jetfleet up`` shares a host's cores out
among its engines, and the pin itself on real processes (a thread started before it, and a
child started after it, end up on the same cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from workers.engines.vllm.config import VllmEngineConfig
from workers.engines.vllm.cpu_list import format_cpu_list, parse_cpu_list
from workers.engines.vllm.platform import fleet_cpu_sets


@pytest.mark.parametrize(
    ("text", "cores"),
    [("0", {0}), ("0-3", {0, 1, 2, 3}), ("0-1,4,6-7", {0, 1, 4, 6, 7}), (" 2 , 5 ", {2, 5})],
)
def test_cpu_lists_are_read_and_written_as_linux_does(text: str, cores: set[int]) -> None:
    assert parse_cpu_list(text) == cores
    assert parse_cpu_list(format_cpu_list(sorted(cores))) == cores
    assert format_cpu_list([7, 6, 4, 1, 0]) == "0-1,4,6-7"


@pytest.mark.parametrize("text", ["", "a", "1-", "3-1", "0,,1", "-1"])
def test_a_bad_cpu_list_is_refused_at_start(text: str) -> None:
    with pytest.raises(ValueError, match="CPU list"):
        VllmEngineConfig(model="/m", cpu_cores=text)


def test_none_means_unpinned() -> None:
    assert VllmEngineConfig(model="/m", cpu_cores="none").cpu_cores == "none"


@pytest.mark.parametrize(
    ("cores", "engines", "threads", "want"),
    [
        ([0, 1], 1, 2, None),  # one engine on every core: nothing to pin
        ([0, 1], 2, 1, ["0", "1"]),  # this machine, two engines: a core each
        ([0, 1], 4, 1, ["0", "1", "0", "1"]),  # more engines than cores: two to a core
        ([0, 1, 2, 3], 1, 3, ["1-3"]),  # one core kept for the fleet from 4 cores on
        ([0, 1, 2, 3, 4, 5, 6, 7], 2, 3, ["1-3", "4-6"]),
        ([0, 1, 2, 3, 4, 5, 6, 7], 3, 2, ["1-2", "3-4", "5-6"]),
        ([2, 3, 6, 7, 8], 2, 2, ["3,6", "7-8"]),  # the cores this process may use, in order
        ([0, 1, 2, 3], 2, 8, ["1-3", "1-3"]),  # more threads than cores: the engines share
    ],
)
def test_up_gives_each_engine_cores_of_its_own(
    cores: list[int], engines: int, threads: int, want: list[str] | None
) -> None:
    assert fleet_cpu_sets(cores, engines, threads) == want


def test_a_connector_starts_each_engine_on_the_slice_fewest_run_on() -> None:
    from planner.connectors.local import least_used

    assert least_used(["0", "1"], []) == "0"
    assert least_used(["0", "1"], ["0"]) == "1"  # the engine started to meet a burst
    assert least_used(["0", "1"], ["1"]) == "0"  # the freed slice is taken again
    assert least_used(["0", "1"], ["0", "1"]) == "0"  # all taken: shared, the first first
    assert least_used(["1-3", "4-6", "7-9"], ["1-3", "4-6", "1-3"]) == "7-9"


def _up(argv: list[str], cores: int, capsys: pytest.CaptureFixture[str]) -> tuple[object, str]:
    from infra.cli import parse_args
    from infra.up import _place_cpu_engines

    args = parse_args(["up", "--engine", "vllm", "--model", ".", *argv])
    sets = _place_cpu_engines(args, list(range(cores)))
    return (args.cpu_threads, sets), capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "cores", "threads", "sets", "warned"),
    [
        # a fixed fleet: its engines share the cores out, each on a slice (as before)
        (["--no-planner"], 2, 1, ["0", "1"], False),  # up's default: two workers
        (["--no-planner", "--workers", "1"], 2, 2, None, False),
        # the planner: threads for the engines it starts with, slices for the most it may run
        ([], 2, 1, ["0", "1"], True),  # two to start with, up to 8: two to a core past two
        (["--max-replicas", "agg=2"], 2, 1, ["0", "1"], False),
        (["--workers", "1", "--max-replicas", "agg=2", "--cpu-threads", "1"],
         2, 1, ["0", "1"], False),
        (["--workers", "1", "--max-replicas", "agg=3", "--max-total-replicas", "2",
          "--cpu-threads", "1"], 2, 1, ["0", "1"], False),
        (["--workers", "1", "--max-replicas", "agg=2"], 8, 7, ["1-7"], True),  # the fleet's core
        (["--workers", "1", "--max-replicas", "agg=2", "--cpu-threads", "3"],
         8, 3, ["1-3", "4-6"], False),
        # from 4 cores on one is kept for the fleet: three engines of one thread have cores of
        # their own, a fourth shares, and that is said
        (["--workers", "1", "--max-replicas", "agg=4", "--cpu-threads", "1"],
         4, 1, ["1", "2", "3"], True),
        (["--workers", "1", "--max-replicas", "agg=1", "--cpu-threads", "8"],
         8, 8, ["1-7"], False),  # as a fixed fleet of one: off the fleet's core
        # a bad planner setting is the planner's to refuse: placed for the engines started
        (["--set", "no_such_setting=1"], 2, 1, ["0", "1"], False),
        # one engine on every core, and more may come: unpinned, and said
        (["--workers", "1", "--max-replicas", "agg=2"], 2, 2, None, True),
        (["--workers", "1", "--max-replicas", "agg=1"], 2, 2, None, False),
        (["--max-replicas", "agg=2", "--cpu-cores", "none"], 2, 1, None, False),
    ],
)  # fmt: skip
def test_up_sizes_and_places_the_engines_the_planner_may_start(
    argv: list[str],
    cores: int,
    threads: int,
    sets: list[str] | None,
    warned: bool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    placed, said = _up(argv, cores, capsys)
    assert placed == (threads, sets)
    assert ("slow each other down" in said) is warned, said


PROBE = """
import json, os, subprocess, sys, threading
from workers.engines.vllm.pinning import pin_process
started = threading.Event(); stop = threading.Event()
def run():
    started.set(); stop.wait()
t = threading.Thread(target=run); t.start(); started.wait()
pin_process({core})
thread = [int(x) for x in os.listdir('/proc/self/task') if int(x) != os.getpid()][0]
child = subprocess.run(
    [sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'],
    capture_output=True, text=True, check=True,
).stdout
found = {{
    'main': sorted(os.sched_getaffinity(0)),
    'thread': sorted(os.sched_getaffinity(thread)),  # while it still runs
    'child': json.loads(child),
}}
stop.set(); t.join()
print(json.dumps(found))
"""


def test_the_pin_moves_every_thread_and_is_inherited() -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: every thread is on it, pinned or not")
    core = max(os.sched_getaffinity(0))
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(core={core})],
        capture_output=True, text=True, check=True, cwd=os.getcwd(),
    )  # fmt: skip
    assert json.loads(done.stdout) == {"main": [core], "thread": [core], "child": [core]}


def test_a_core_the_process_may_not_use_is_refused() -> None:
    from workers.engines.vllm.pinning import pin_process

    missing = max(os.sched_getaffinity(0)) + 4096
    with pytest.raises(OSError):
        pin_process({missing})
