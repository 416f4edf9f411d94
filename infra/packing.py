"""How ``jetfleet up`` packs mocker workers into processes (``jetfleet worker --replicas``).

Pure: the CLI resolves ``--workers-per-process auto`` with it, ``up`` cuts the pools with it.
"""

from __future__ import annotations

AUTO = 0  # --workers-per-process auto
PACK_FROM = 64  # fleets from this size are packed by default (and refused with the planner)
PACK_SIZE = 256  # workers per process a packed fleet aims at


def auto_per_process(workers: int, cores: int, one_per_process: bool) -> int:
    """Workers per process for ``--workers-per-process auto``: one each while the fleet is
    small (a worker is then a process a user can kill, as in production) or when a process can
    only hold one (the planner's connector, a real engine); else as few processes as keep every
    core busy, each at most ``PACK_SIZE`` workers (1,024 workers on 2 cores: 4 of 256)."""
    if one_per_process or workers < PACK_FROM:
        return 1
    processes = min(workers, max(cores, -(-workers // PACK_SIZE)))
    return -(-workers // processes)


def worker_packs(workers: int, per_process: int) -> list[int]:
    """How many workers each process runs: ``ceil(workers / per_process)`` processes, their
    sizes at most one apart (10 by 4: 4, 3, 3)."""
    processes = -(-workers // per_process)
    base, extra = divmod(workers, processes) if processes else (0, 0)
    return [base + (1 if i < extra else 0) for i in range(processes)]
