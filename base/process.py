"""The local fleet supervisor behind ``jetfleet up``: embedded servers plus component processes.

Every component runs as its own process with exactly the command a real deployment would use
(``jetfleet frontend``, ``jetfleet worker``...), pointed at the embedded NATS and Redis. Ctrl-C or
SIGTERM stops the fleet in order: frontends and workers get SIGTERM (they drain), then the servers
stop. A worker process can be added or removed while the fleet runs (the local scaling connector
uses the same ``ProcessGroup``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import structlog

log = structlog.get_logger("jetfleet.up")


def die_with_parent() -> None:
    """In a child between fork and exec: SIGTERM it when its parent dies (Linux
    ``PR_SET_PDEATHSIG``), so a killed supervisor never leaves its processes behind."""
    if sys.platform != "linux":
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "infra.cli", *args]


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes]
    log_path: Path


@dataclass
class ProcessGroup:
    log_dir: Path
    children: dict[str, Child] = field(default_factory=dict)
    inherit_output: bool = False  # children write to our stdout/stderr, not to log files

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        log_path = self.log_dir / f"{name}.log"
        if self.inherit_output:
            proc = subprocess.Popen(
                argv,
                env={**os.environ, **(env or {})},
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        else:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with log_path.open("ab") as out:
                proc = subprocess.Popen(
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **(env or {})},
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
        child = Child(name, argv, proc, log_path)
        self.children[name] = child
        log.info("process_started", name=name, pid=proc.pid, log=str(log_path))
        return child

    def stop(self, name: str, timeout_s: float = 30.0) -> int | None:
        child = self.children.pop(name, None)
        if child is None:
            return None
        return _terminate(child, timeout_s)

    def stop_all(self, timeout_s: float = 30.0) -> None:
        names = list(self.children)
        for name in names:  # SIGTERM everyone first: they drain in parallel
            proc = self.children[name].proc
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name in names:
            self.stop(name, timeout_s)

    def exited(self) -> list[Child]:
        return [c for c in self.children.values() if c.proc.poll() is not None]


def _terminate(child: Child, timeout_s: float) -> int | None:
    proc = child.proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("process_killed", name=child.name, pid=proc.pid)
            proc.kill()
            proc.wait()
    return proc.returncode


def wait_http_ok(url: str, timeout_s: float, group: ProcessGroup | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if group is not None and (dead := group.exited()):
            tail = dead[0].log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{dead[0].name} exited during start-up:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == 200:
                    return
        except Exception as exc:
            last = str(exc)
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout_s}s ({last})")
