"""``jetfleet frontend --processes N``: N frontend processes on one port, supervised.

Each child is an ordinary ``jetfleet frontend`` bound with SO_REUSEPORT, so the kernel spreads
new connections over them and each one keeps its own event loop, tokenizer threads and NATS
connection (they are stateless: any of them can serve any request). The supervisor restarts a
child that dies (``Restarter``: after 1 s, backing off while it keeps dying), and on SIGTERM or
SIGINT stops them all; each drains its requests. Prometheus' multi-process mode
(``PROMETHEUS_MULTIPROC_DIR``, a directory made here) lets any child answer ``/metrics`` for all
of them.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
import threading
from pathlib import Path

import structlog

from base.process import ProcessGroup, Restarter
from infra.command import cli_command

log = structlog.get_logger("jetfleet.frontend")


def run_frontend_processes(n: int, argv: list[str], port: int) -> int:
    if port == 0:
        print("jetfleet frontend: --processes needs a fixed --port (they share it)")
        return 2
    stop = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    metrics_dir = Path(tempfile.mkdtemp(prefix="jetfleet-frontend-metrics-"))
    env = {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    group = ProcessGroup(metrics_dir / "logs", inherit_output=True)
    command = cli_command("frontend", *argv, "--reuse-port", "--processes", "1")
    restarter = Restarter(group, env, on_exit=lambda child: _forget(metrics_dir, child.proc.pid))
    try:
        for i in range(n):
            group.start(f"frontend-{i}", command, env)
        log.info("frontend_processes_started", processes=n, port=port)
        while not stop.wait(0.5):
            restarter.poll()
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the drain
        group.stop_all(timeout_s=40.0)
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def _forget(metrics_dir: Path, pid: int) -> None:
    """Drop a dead child's live gauges (its counters and histograms stay in the sums)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, str(metrics_dir))  # type: ignore[no-untyped-call]
