"""Groups of child processes: start each with its log file, restart those that exit, stop them,
wait for one's HTTP endpoint.

A child gets SIGTERM when its parent dies (Linux), so a killed supervisor never leaves processes
behind. Stopping sends SIGTERM to every child first, so they drain in parallel, and kills one that
outlives the timeout. What a child runs is the caller's argv: this module names no command (the
``jetfleet`` command line is ``infra.command.cli_command``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

log = structlog.get_logger("jetfleet.process")


def die_with_parent() -> None:
    """In a child between fork and exec: SIGTERM it when its parent dies (Linux
    ``PR_SET_PDEATHSIG``), so a killed supervisor never leaves its processes behind."""
    if sys.platform != "linux":
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


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


@dataclass
class Restarter:
    """Restarts the group's processes that exit: after 1 s, doubling up to ``max_backoff_s``
    while one keeps exiting, back to 1 s once it has run a minute. Call ``poll`` periodically;
    it returns the processes that exited since the last call, each with its wait."""

    group: ProcessGroup
    env: dict[str, str] | None = None  # the environment every restart gets
    on_exit: Callable[[Child], None] = lambda _child: None  # e.g. drop its metrics files
    max_backoff_s: float = 30.0
    _backoff: dict[str, float] = field(default_factory=dict)
    _due: dict[str, float] = field(default_factory=dict)
    _started: dict[str, float] = field(default_factory=dict)

    def poll(self) -> list[tuple[Child, float]]:
        now = time.monotonic()
        noticed: list[tuple[Child, float]] = []
        for child in self.group.exited():
            name = child.name
            if name not in self._due:
                ran = now - self._started.get(name, 0.0)
                wait = (
                    1.0 if ran > 60.0 else min(self._backoff.get(name, 0.5) * 2, self.max_backoff_s)
                )
                self._backoff[name], self._due[name] = wait, now + wait
                sweep_session(child)
                self.on_exit(child)
                log.warning(
                    "component_exited", name=name, code=child.proc.returncode, restart_in_s=wait
                )
                noticed.append((child, wait))
            elif now >= self._due[name]:
                del self._due[name]
                self.group.start(name, child.argv, self.env)
                self._started[name] = time.monotonic()
        return noticed


def terminate(proc: subprocess.Popen[bytes], timeout_s: float, name: str) -> int | None:
    """SIGTERM, wait up to ``timeout_s``, then SIGKILL; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("process_killed", name=name, pid=proc.pid)
            proc.kill()
            proc.wait()
    return proc.returncode


def _terminate(child: Child, timeout_s: float) -> int | None:
    rc = terminate(child.proc, timeout_s, child.name)
    sweep_session(child)
    return rc


def sweep_session(child: Child) -> None:
    """SIGKILL what is left of an exited child's session: the processes it started that did not
    end with it (an engine's own children, when the child was killed before it could stop
    them). Every child leads its own session and process group (``start_new_session``)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.proc.pid, signal.SIGKILL)


def wait_http_ok(
    url: str,
    timeout_s: float,
    group: ProcessGroup | None = None,
    progress: Callable[[float], None] | None = None,
    progress_every_s: float = 15.0,
    until: Callable[[bytes], bool] | None = None,
) -> None:
    """Until ``url`` answers 200 (and ``until(body)`` holds, when given); ``progress(seconds
    waited)`` every ``progress_every_s``."""
    start = time.monotonic()
    deadline = start + timeout_s
    next_progress = start + progress_every_s
    last = ""
    while time.monotonic() < deadline:
        if progress is not None and time.monotonic() >= next_progress:
            progress(time.monotonic() - start)
            next_progress += progress_every_s
        if group is not None and (dead := group.exited()):
            tail = dead[0].log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{dead[0].name} exited during start-up:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == 200 and (until is None or until(resp.read())):
                    return
                last = "answered, condition not met yet"
        except Exception as exc:
            last = str(exc)
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout_s}s ({last})")
