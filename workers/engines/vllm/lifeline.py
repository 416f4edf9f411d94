"""vLLM's engine processes end with the worker that started them, however it ends.

``AsyncLLM`` runs the model in child processes (``EngineCore``, and on the CPU build a
``Worker`` below it). vLLM's ``Worker`` watches its ``EngineCore`` (a death pipe), but nothing
watches the process that built ``AsyncLLM``: a worker killed with SIGKILL, or stopped by a signal
while the engine was still loading, left ``EngineCore`` and its ``Worker`` running, re-parented to
init, one of them spinning a core (seen on the CPU build, 0.32.0).

vLLM loads the ``vllm.general_plugins`` entry points in every one of its processes; jetfleet
registers ``watch_parent`` there (pyproject.toml). Before it builds ``AsyncLLM`` the worker calls
``mark_owner()``, which puts its pid in the environment its children inherit. In a process below
that owner, ``watch_parent`` starts a daemon thread that polls ``os.getppid()`` every
``POLL_S`` and SIGKILLs its own process as soon as the parent changed (it died: the process was
re-parented). ``EngineCore`` goes within ``POLL_S`` of the worker, its ``Worker`` within ``POLL_S``
of ``EngineCore``. Polling the parent id, unlike ``PR_SET_PDEATHSIG``, does not depend on which
thread of the parent forked the child (``AsyncLLM`` is built in a thread). Outside a jetfleet
worker (no owner in the environment) the plugin does nothing.

This module imports nothing of vLLM's or jetfleet's: vLLM imports it early in each process.
"""

from __future__ import annotations

import os
import signal
import threading
import time

OWNER_ENV = "JETFLEET_VLLM_OWNER_PID"
POLL_S = 0.5


def mark_owner() -> None:
    """In the worker, before vLLM starts its processes: they are to end with this one."""
    os.environ[OWNER_ENV] = str(os.getpid())


def watch_parent() -> None:
    """The ``vllm.general_plugins`` entry point (vLLM calls it once per process)."""
    owner = os.environ.get(OWNER_ENV)
    if not owner or owner == str(os.getpid()):
        return  # not under a jetfleet worker, or the worker itself
    parent = os.getppid()
    threading.Thread(target=_watch, args=(parent,), name="jetfleet-lifeline", daemon=True).start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    os.kill(os.getpid(), signal.SIGKILL)
