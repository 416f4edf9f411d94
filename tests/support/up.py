"""``jetfleet up`` started as a user starts it, for tests: its own ports and state directory,
waited on until it says it is up and every worker it started is registered."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from base.ports import free_port
from base.process import wait_http_ok
from infra.command import cli_command
from schemas import Subjects
from tests.support.wait import wait_line, wait_until


@dataclass
class Up:
    base_url: str
    nats_url: str
    redis_url: str
    subjects: Subjects
    proc: subprocess.Popen[bytes]
    log: Path

    def workers(self) -> list[dict[str, Any]]:
        """Ready workers as ``jetfleet status --json`` lists them."""
        return ready_workers(self.nats_url)


def ready_workers(nats_url: str) -> list[dict[str, Any]]:
    """The ready workers on a NATS, as ``jetfleet status --json`` lists them."""
    done = subprocess.run(
        cli_command("status", "--json", "--nats", nats_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)["workers"]
    return [w for w in rows if w["status"] == "ready"]


def up_argv(tmp_path: Path, port: int, *extra: str) -> list[str]:
    """``jetfleet up`` on its own free ports and state directory, plus ``extra``."""
    state = str(tmp_path / "state")
    return cli_command(
        "up", "--port", str(port), "--nats-port", "0", "--redis-port", "0", "--state-dir", state,
        *extra,
    )  # fmt: skip


@contextlib.contextmanager
def running_up(
    tmp: Path, workers: int, *extra: str, start_timeout_s: float = 120.0, planner: bool = False
) -> Iterator[Up]:
    """``jetfleet up --no-planner --workers N`` plus ``extra`` (``--nats URL``: on that NATS),
    until it says it is up and every worker is registered; stopped with Ctrl-C at the end.
    ``planner``: autoscaled (``up``'s default) instead of ``--no-planner``."""
    port = free_port()
    fixed = () if planner else ("--no-planner",)
    argv = up_argv(tmp, port, "--workers", str(workers), *fixed, *extra)
    log = tmp / "up.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    try:
        up = wait_line(log, _UP_LINE, start_timeout_s, proc)
        fleet = Up(f"http://127.0.0.1:{port}", up.group(1), up.group(2), Subjects(), proc, log)
        wait_http_ok(f"{fleet.base_url}/ready", 30)
        wait_ready_workers(fleet, workers, start_timeout_s)
        yield fleet
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(120)


def wait_ready_workers(fleet: Up, workers: int, timeout_s: float) -> list[dict[str, Any]]:
    """Until ``workers`` workers are registered and ready (a restarted one included)."""

    def ready() -> list[dict[str, Any]] | None:
        rows = fleet.workers()
        return rows if len(rows) >= workers else None

    rows: list[dict[str, Any]] = wait_until(ready, timeout_s, f"{workers} workers ready", 0.5)
    return rows


_UP_LINE = re.compile(r"jetfleet is up.*\nNATS (\S+) \(clients publish.*Redis (\S+)")
