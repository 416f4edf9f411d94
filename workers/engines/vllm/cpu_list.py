"""Linux CPU lists (``0-3,8``), as ``taskset -c`` takes them and ``/proc/<pid>/status`` writes
them (``Cpus_allowed_list``). Pure."""

from __future__ import annotations

from collections.abc import Sequence


def parse_cpu_list(text: str) -> frozenset[int]:
    """A Linux CPU list (``0-3,8``, as ``taskset -c`` and ``/proc/*/status`` write it)."""
    cores: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"not a CPU list: {text!r} (e.g. 0-3,8)")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise ValueError(f"not a CPU list: {text!r} ({part.strip()} runs backwards)")
        cores.update(range(low, high + 1))
    return frozenset(cores)


def format_cpu_list(cores: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    runs: list[list[int]] = []
    for core in sorted(set(cores)):
        if runs and core == runs[-1][1] + 1:
            runs[-1][1] = core
        else:
            runs.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
