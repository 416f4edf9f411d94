"""What vLLM's CPU build needs from its environment, decided from the config. Pure.

vLLM reads its CPU settings from environment variables, in the processes it starts
(``EngineCore`` and its ``Worker`` inherit the worker's environment). Without them it does not
serve on an ordinary machine: by default it asks for most of a NUMA node as KV cache and stops
when that is more than the machine has, and it binds its threads to cores by a rule that failed
here. ``cpu_environment`` gives the variables to set: the config's value where the operator gave
one (a flag wins over the environment), else the environment's own, else a default that works
on a laptop:

- ``VLLM_CPU_KVCACHE_SPACE`` (GiB): ``cpu_kv_cache_gib``, default 1;
- ``VLLM_CPU_OMP_THREADS_BIND``: ``nobind`` (the OS places the threads; binding made vLLM's
  start fail here and gains little when several workers share a machine);
- ``OMP_NUM_THREADS``: ``cpu_threads``, default every core this process may use; ``jetfleet up``
  gives each of its workers its share of the cores (``fleet_cpu_threads``), keeping one for the
  fleet's own processes (frontend, NATS, Redis, router: they wake on every token and take a core
  from an OpenMP thread its partner waits for) from 4 cores on. Below that a real model needs
  the core more than the fleet does (measured: docs/benchmarks.md, "Measurements behind design
  choices");
- the cores (``cpu_cores``, a Linux CPU list such as ``0-3,8``): the worker and the engine
  processes it starts run on these cores only (``pin_process``, inherited by vLLM's processes).
  ``jetfleet up`` gives each CPU engine it starts cores of its own (``fleet_cpu_sets``) when it
  starts more than one or keeps a core for the fleet (with the planner: slices for the most
  engines it may run, handed out by its connector); a lone engine on every core, or ``none``,
  stays where the OS puts it. Each engine is two busy processes: ``VLLM::Worker`` computes the
  step while ``EngineCore`` spins (``sched_yield``) on shared memory for its answer. Left to
  the OS, two engines on two cores gave their spinners half a core that the other engine's
  ``Worker`` could have used. Pinned, a spinner only ever yields to its own ``Worker``
  (measured: two SmolLM2 engines, 0.96 -> 1.32 req/s, docs/engines/vllm.md);
- ``OMP_WAIT_POLICY``: not set (OpenMP's own default, as vLLM's server and Dynamo's worker run:
  a thread spins briefly at a barrier, then sleeps). ``PASSIVE`` (sleep at once), which this
  worker set until 2026-11-28, cost a real model two fifths of its speed at concurrency 1: each
  of a step's hundreds of parallel regions then pays a wake-up (measured: same section). An
  ``OMP_WAIT_POLICY`` in the environment is kept.

And the model's dtype (``cpu_dtype``): vLLM's ``auto`` picks bfloat16 on a CPU, whose kernels need
native bf16 (AVX512-BF16 or AMX on x86, BF16 on Arm); without it vLLM falls back to slow paths
("Failed to create oneDNN linear"; several times slower, measured: same section). So ``auto``
means float32 on such a CPU; a dtype given explicitly is kept.

On a GPU none of this applies and nothing is set.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from workers.engines.vllm.config import VllmEngineConfig
from workers.engines.vllm.cpu_list import format_cpu_list

DEFAULT_KV_CACHE_GIB = 1


FLEET_CORE_FROM = 4  # hosts with this many cores keep one for the fleet's own processes


def fleet_cpu_threads(cores: int, engines: int) -> int:
    """OpenMP threads for each of ``engines`` CPU engines sharing ``cores`` with the rest of a
    fleet on one host (``jetfleet up``): every core shared out, less one for the fleet from
    ``FLEET_CORE_FROM`` cores on (the engines then keep at least three), at least one each."""
    return max(1, (cores - fleet_spare_cores(cores)) // max(1, engines))


def fleet_spare_cores(cores: int) -> int:
    """Cores kept for the fleet's own processes on a host of ``cores``."""
    return 1 if cores >= FLEET_CORE_FROM else 0


def fleet_cpu_sets(cores: Sequence[int], engines: int, threads: int) -> list[str] | None:
    """The cores of each of ``engines`` CPU engines of ``threads`` threads that ``jetfleet up``
    starts on a host whose usable ``cores`` are these: consecutive slices of ``threads`` cores,
    after the one kept for the fleet from ``FLEET_CORE_FROM`` cores on; with more engines than
    slices, engine i takes slice i mod slices (engines share a slice, never straddle two).
    None when there is nothing to pin: one engine on every core."""
    usable = sorted(set(cores))
    spare = fleet_spare_cores(len(usable))
    if engines < 1 or (engines == 1 and not spare):
        return None
    width = max(1, min(threads, len(usable) - spare))
    slices = max(1, (len(usable) - spare) // width)
    return [format_cpu_list(usable[spare + (i % slices) * width :][:width]) for i in range(engines)]


BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # x86 (cpuinfo flags), Arm (Features)


def cpu_dtype(requested: str, cpu_flags: frozenset[str]) -> str:
    """The dtype vLLM's CPU build runs: float32 for ``auto`` without native bf16."""
    if requested != "auto" or cpu_flags & BF16_FLAGS:
        return requested
    return "float32"


def read_cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The CPU's feature flags from the text of /proc/cpuinfo (x86 ``flags``, Arm ``Features``)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_environment(
    cfg: VllmEngineConfig, environ: Mapping[str, str], cpu_count: int
) -> dict[str, str]:
    """The variables to set before vLLM's CPU build starts (only those that change)."""
    want: dict[str, str] = {}
    if cfg.cpu_kv_cache_gib is not None:
        want["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.cpu_kv_cache_gib)
    elif "VLLM_CPU_KVCACHE_SPACE" not in environ:
        want["VLLM_CPU_KVCACHE_SPACE"] = str(DEFAULT_KV_CACHE_GIB)
    if "VLLM_CPU_OMP_THREADS_BIND" not in environ:
        want["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    if cfg.cpu_threads is not None:
        want["OMP_NUM_THREADS"] = str(cfg.cpu_threads)
    elif "OMP_NUM_THREADS" not in environ:
        want["OMP_NUM_THREADS"] = str(max(1, cpu_count))
    return {k: v for k, v in want.items() if environ.get(k) != v}
