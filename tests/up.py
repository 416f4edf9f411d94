"""``jetfleet up`` started as a user starts it, for tests: its own ports and state directory,
waited on until it says it is up and every worker it started is registered."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from base.process import cli_command, wait_http_ok
from infra.embedded import free_port
from schemas import Subjects


@dataclass
class Up:
    base_url: str
    nats_url: str
    subjects: Subjects
    proc: subprocess.Popen[bytes]
    log: Path

    def workers(self) -> list[dict[str, Any]]:
        """Ready workers as ``jetfleet status --json`` lists them."""
        done = subprocess.run(
            cli_command("status", "--json", "--nats", self.nats_url),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        rows: list[dict[str, Any]] = json.loads(done.stdout)["workers"]
        return [w for w in rows if w["status"] == "ready"]


@contextlib.contextmanager
def running_up(tmp: Path, workers: int, *extra: str, nats_url: str | None = None) -> Iterator[Up]:
    """``jetfleet up --no-planner --workers N`` plus ``extra``; on an embedded NATS unless
    ``nats_url`` (then ``extra`` passes ``--nats``); stopped with Ctrl-C at the end."""
    port = free_port()
    ports = [] if nats_url else ["--nats-port", str(free_port())]
    argv = cli_command(
        "up", "--port", str(port), *ports, "--redis-port", "0",
        "--state-dir", str(tmp / "state"), "--workers", str(workers), "--no-planner", *extra,
    )  # fmt: skip
    log = tmp / "up.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    url = nats_url or f"nats://127.0.0.1:{ports[1]}"
    fleet = Up(f"http://127.0.0.1:{port}", url, Subjects(), proc, log)
    try:
        deadline = time.monotonic() + 120
        while "jetfleet is up" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        wait_http_ok(f"{fleet.base_url}/ready", 30)
        deadline = time.monotonic() + 60
        while len(fleet.workers()) < workers:
            assert time.monotonic() < deadline, "the workers did not all register"
            time.sleep(0.2)
        yield fleet
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(120)
