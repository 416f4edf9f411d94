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
- ``OMP_NUM_THREADS``: ``cpu_threads``, default every core this process may use (``jetfleet up``
  gives each of its workers its share).

On a GPU none of this applies and nothing is set.
"""

from __future__ import annotations

from collections.abc import Mapping

from workers.engines.vllm.config import VllmEngineConfig

DEFAULT_KV_CACHE_GIB = 1


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
