"""Pin the worker, and the engine processes it starts, to cores (``VllmEngineConfig.cpu_cores``;
why: ``platform.py``).

``os.sched_setaffinity(0, ...)`` moves only the calling thread on Linux, so every thread the
process has is moved; threads and processes started afterwards (vLLM's ``EngineCore`` and its
``Worker``, their OpenMP threads) inherit the mask.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Set


def pin_process(cores: Set[int]) -> None:
    """This process, every thread of it, on ``cores`` only (those it may not use are refused by
    the OS: ``OSError``)."""
    os.sched_setaffinity(0, cores)  # the calling thread first: a bad set fails here, whole
    pin_threads(os.getpid(), cores)


def pin_threads(pid: int, cores: Set[int]) -> int:
    """Every thread of process ``pid`` on ``cores`` only; how many were moved (0: the process
    is gone)."""
    moved = 0
    with contextlib.suppress(FileNotFoundError):  # the process ended
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(tid), cores)
                moved += 1
    return moved
