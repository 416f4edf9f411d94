"""``jetfleet up --engine vllm`` with two engines gives each its own cores: the worker and
every vLLM process under it (``EngineCore``, its ``Worker``, their threads) run on one slice of
the host's cores, and no two engines share a slice while there are cores enough
(``platform.fleet_cpu_sets``; why: ``platform.py``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.up import Up, running_up, wait_ready_workers
from tests.vllm_engine.conftest import START_TIMEOUT_S
from tests.vllm_engine.support import cores_of, engine_processes
from workers.engines.vllm.cpu_list import parse_cpu_list
from workers.engines.vllm.platform import fleet_cpu_sets, fleet_cpu_threads

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


@pytest.fixture(scope="module")
def pinned_fleet(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """Two engines as ``up`` starts them by default (the shared ``real_fleet`` runs unpinned)."""
    with running_up(
        tmp_path_factory.mktemp("pinned"), 2, "--engine", "vllm", "--model", str(tiny_llama),
        "--max-model-len", "1024", start_timeout_s=START_TIMEOUT_S,
    ) as fleet:  # fmt: skip
        yield fleet


def test_each_engine_runs_on_cores_of_its_own(pinned_fleet: Up) -> None:
    workers = wait_ready_workers(pinned_fleet, 2, START_TIMEOUT_S)
    usable = sorted(os.sched_getaffinity(0))
    want = fleet_cpu_sets(usable, 2, fleet_cpu_threads(len(usable), 2))
    placed: list[frozenset[int]] = []
    for worker in workers:
        owner = int(worker["pid"])
        engines = engine_processes(owner)
        assert len(engines) >= 2, f"worker {owner}: no EngineCore and Worker under it"
        cores = {cores_of(owner)}
        cores |= {cores_of(pid, tid) for pid in engines for tid in _threads(pid)}
        assert len(cores) == 1, f"worker {owner}'s processes run on different cores: {cores}"
        placed.append(cores.pop())
    assert want is not None  # two engines are always pinned
    assert sorted(placed, key=min) == sorted((parse_cpu_list(c) for c in want), key=min), (
        f"want {want}"
    )
