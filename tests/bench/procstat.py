"""CPU seconds of processes from /proc (Linux), for "where does the CPU go" reports."""

from __future__ import annotations

import os
import resource

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of ``pid`` (0.0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (a supervisor and its processes), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants."""
    return sum(cpu_seconds(p) for p in tree(pid))


def self_cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class CpuMeter:
    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._start: dict[str, float] = {}

    def start(self) -> None:
        self._start = {n: tree_cpu_seconds(p) for n, p in self.pids.items()}
        self._start["load_client"] = self_cpu_seconds()

    def stop(self) -> dict[str, float]:
        now = {n: tree_cpu_seconds(p) for n, p in self.pids.items()}
        now["load_client"] = self_cpu_seconds()
        return {n: round(now[n] - self._start.get(n, 0.0), 3) for n in now}


def label(pid: int) -> str:
    """A process's name for a report: its command name, and for a Python process the module or
    ``jetfleet`` subcommand it runs (``jetfleet worker``, ``VLLM::EngineCore``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
    except OSError:
        return "?"
    if not argv or "python" not in os.path.basename(argv[0]):
        return comm if not argv else os.path.basename(argv[0]).split()[0]
    rest = argv[1:]
    if rest[:1] == ["-m"] and len(rest) > 1:
        module = rest[1]
        return f"{module} {rest[2]}" if module == "infra.cli" and len(rest) > 2 else module
    if rest and rest[0].endswith("jetfleet"):
        return f"jetfleet {rest[1]}" if len(rest) > 1 else "jetfleet"
    return comm  # vLLM's engine processes name themselves (VLLM::EngineCore, VLLM::Worker)


def tree_by_process(pid: int) -> dict[int, tuple[str, float]]:
    """Each live process of ``pid``'s tree: (its label, its CPU seconds)."""
    return {p: (label(p), cpu_seconds(p)) for p in tree(pid)}


def breakdown(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds between two ``tree_by_process`` readings, summed by label (processes that
    started between them count from 0), largest first."""
    out: dict[str, float] = {}
    for p, (name, cpu) in after.items():
        out[name] = out.get(name, 0.0) + cpu - before.get(p, (name, 0.0))[1]
    return {k: round(v, 2) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}
