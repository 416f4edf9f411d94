"""What vLLM's CPU build is given: its environment (a flag wins over the environment, which wins
over the laptop default) and eager mode, and the lifeline that ends vLLM's processes with their
worker, tried on real processes (no vLLM needed)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from tests.support.wait import wait_for
from workers.engines.vllm import lifeline
from workers.engines.vllm.config import VllmEngineConfig, engine_args_kwargs
from workers.engines.vllm.platform import cpu_dtype, cpu_environment, read_cpu_flags

CFG = VllmEngineConfig(model="/m")


@pytest.mark.parametrize(
    ("cfg", "environ", "want"),
    [
        (  # nothing set: the laptop defaults, every core
            CFG,
            {},
            {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
             "OMP_NUM_THREADS": "4"},
        ),
        (  # the operator's environment stays
            CFG,
            {"VLLM_CPU_KVCACHE_SPACE": "8", "VLLM_CPU_OMP_THREADS_BIND": "0-3",
             "OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "ACTIVE"},
            {},
        ),
        (  # a flag wins over the environment
            VllmEngineConfig(model="/m", cpu_kv_cache_gib=3, cpu_threads=1),
            {"VLLM_CPU_KVCACHE_SPACE": "8", "OMP_NUM_THREADS": "2"},
            {"VLLM_CPU_KVCACHE_SPACE": "3", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
             "OMP_NUM_THREADS": "1"},
        ),
    ],
)  # fmt: skip
def test_cpu_environment(
    cfg: VllmEngineConfig, environ: dict[str, str], want: dict[str, str]
) -> None:
    assert cpu_environment(cfg, environ, cpu_count=4) == want


@pytest.mark.parametrize(
    ("requested", "flags", "want"),
    [
        ("auto", {"avx", "avx2", "fma"}, "float32"),  # AVX2 only (this machine): no native bf16
        ("auto", {"avx512f", "avx512_bf16"}, "auto"),  # vLLM's choice: bfloat16, fast there
        ("auto", {"amx_bf16"}, "auto"),
        ("auto", {"fp", "asimd", "bf16"}, "auto"),  # Arm with BF16
        ("bfloat16", {"avx2"}, "bfloat16"),  # asked for: kept
    ],
)
def test_the_cpu_dtype(requested: str, flags: set[str], want: str) -> None:
    assert cpu_dtype(requested, frozenset(flags)) == want


def test_cpu_flags_are_read_from_cpuinfo() -> None:
    x86 = "processor\t: 0\nflags\t\t: fpu avx avx2\nbugs\t\t: spectre\n"
    assert read_cpu_flags(x86) == {"fpu", "avx", "avx2"}
    assert read_cpu_flags("Features\t: fp asimd bf16\n") == {"fp", "asimd", "bf16"}
    assert read_cpu_flags("") == frozenset()


def test_bad_cpu_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="cpu_kv_cache_gib"):
        VllmEngineConfig(model="/m", cpu_kv_cache_gib=0)
    with pytest.raises(ValueError, match="cpu_threads"):
        VllmEngineConfig(model="/m", cpu_threads=0)


def test_eager_by_default_on_the_cpu_build_only() -> None:
    assert engine_args_kwargs(CFG, None, on_cpu=True)["enforce_eager"] is True
    assert engine_args_kwargs(CFG, None, on_cpu=False)["enforce_eager"] is False
    compiled = VllmEngineConfig(model="/m", enforce_eager=False)
    assert engine_args_kwargs(compiled, None, on_cpu=True)["enforce_eager"] is False


# A "worker" that marks itself the owner and starts an "engine process" which, as vLLM does in
# each of its processes, runs the plugin; the engine process then starts a grandchild of its own.
_ENGINE = """
import os, subprocess, sys, time
from workers.engines.vllm import lifeline
lifeline.watch_parent()
if sys.argv[1] == "core":
    worker = subprocess.Popen([sys.executable, "-c", sys.argv[2], "worker", sys.argv[2]])
    print(worker.pid, flush=True)
time.sleep(600)
"""
_OWNER = """
import subprocess, sys
from workers.engines.vllm import lifeline
lifeline.mark_owner()
lifeline.watch_parent()  # in the owner itself: nothing
argv = [sys.executable, "-c", sys.argv[1], "core", sys.argv[1]]
core = subprocess.Popen(argv, stdout=subprocess.PIPE)
print(core.pid, core.stdout.readline().decode().strip(), flush=True)
import time; time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


async def test_engine_processes_end_with_a_worker_killed_by_sigkill() -> None:
    env = {k: v for k, v in os.environ.items() if k != lifeline.OWNER_ENV}
    owner = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _OWNER, _ENGINE,
        stdout=asyncio.subprocess.PIPE, env={**env, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    try:
        assert owner.stdout is not None
        core, worker = (int(x) for x in (await owner.stdout.readline()).split())
        await asyncio.sleep(3 * lifeline.POLL_S)  # a deliberate hold: both poll their parent
        assert _alive(core) and _alive(worker)  # which is there: they keep running
        owner.kill()
        await owner.wait()
        await wait_for(lambda: not _alive(core), 5.0)  # the engine core ends with its worker
        await wait_for(lambda: not _alive(worker), 5.0)  # and the engine's worker with its core
    finally:
        if owner.returncode is None:
            owner.kill()


def test_without_an_owner_the_plugin_does_nothing() -> None:
    env = {k: v for k, v in os.environ.items() if k != lifeline.OWNER_ENV}
    code = (
        "import threading; from workers.engines.vllm import lifeline; "
        "lifeline.watch_parent(); print(threading.active_count())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env={**env, "PYTHONPATH": os.getcwd()},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "1"  # no watcher thread started


def test_up_shares_the_cores_out_and_keeps_one_for_the_fleet_from_four_on() -> None:
    from workers.engines.vllm.platform import fleet_cpu_threads

    assert fleet_cpu_threads(2, 1) == 2  # a real model needs both more than the fleet needs one
    assert fleet_cpu_threads(2, 2) == 1
    assert fleet_cpu_threads(3, 1) == 3  # below 4 cores none is kept back
    assert fleet_cpu_threads(3, 2) == 1
    assert fleet_cpu_threads(3, 5) == 1  # at least one each, even when oversubscribed
    assert fleet_cpu_threads(4, 1) == 3
    assert fleet_cpu_threads(8, 1) == 7
    assert fleet_cpu_threads(8, 2) == 3
    assert fleet_cpu_threads(1, 1) == 1
