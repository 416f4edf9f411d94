"""Free TCP ports for the servers a fleet starts on one machine (embedded NATS and Redis, the
components' operations ports) and for the tests' own: drawn below the kernel's ephemeral range,
probed with a bind, and claimed across processes so two callers are not handed the same one."""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import tempfile
import time
from pathlib import Path

_PORT_FLOOR = 10_000  # below: ports services are configured on (4222, 6379, 8000, ...)
_CLAIM_S = 120.0  # a claimed port is another process's for this long: time to bind it


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _claim(port: int) -> bool:
    """Claim ``port`` for this process on this machine: False if a live claim holds it.

    Claims are files in a directory of this user's under the temp dir, checked and made under
    an exclusive lock, so two processes never both take one (processes with another ``TMPDIR``
    or user do not see them: the bind probe is all they share)."""
    claims = Path(tempfile.gettempdir()) / f"jetfleet-ports-{os.getuid()}"
    try:
        claims.mkdir(mode=0o700, exist_ok=True)
        lock = os.open(claims / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
    except OSError:  # no writable temp dir: the probe alone decides
        return True
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        now = time.time()
        path = claims / str(port)
        with contextlib.suppress(FileNotFoundError):
            if now - path.stat().st_mtime < _CLAIM_S:
                return False
        path.touch()  # made, or its time renewed
        if random.random() < 0.02:  # now and then, drop the claims nobody holds any more
            for old in claims.iterdir():
                with contextlib.suppress(OSError):
                    if old.name != ".lock" and now - old.stat().st_mtime > _CLAIM_S:
                        old.unlink()
        return True
    except OSError:
        return True
    finally:
        os.close(lock)  # and the lock with it


def free_port(host: str = "127.0.0.1", bus_offset: int = 0) -> int:
    """A TCP port free now that no other caller on this machine is handed for a while.

    Binding port 0 and reading it back returns a port from the kernel's ephemeral range, which
    the next outgoing connection of any process may take as its local port before the caller's
    server binds it (a parallel test run saw "cannot listen on 127.0.0.1:32795: it is in use").
    So the port is drawn at random below that range, probed with a bind, and claimed with a file
    under the temp dir so that another process drawing the same port moves on to another one.

    ``bus_offset``: the server also listens on ``port + bus_offset`` (a Redis Cluster node's bus,
    10000 above its client port): that port is probed and claimed too, below the range as well.
    """
    low, _ = ephemeral_range()
    if low - bus_offset - _PORT_FLOOR >= 1_000:
        rng = random.SystemRandom()
        for _ in range(200):
            port = rng.randrange(_PORT_FLOOR, low - bus_offset)
            ports = (port, port + bus_offset) if bus_offset else (port,)
            if all(_bindable(host, p) for p in ports) and all(_claim(p) for p in ports):
                return port
    for _ in range(200):  # an unusual port range: the kernel's choice
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if not bus_offset or _bindable(host, port + bus_offset):
            return port
    raise OSError(f"no free port on {host} with port + {bus_offset} free too")


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def port_is_open(host: str, port: int, timeout_s: float = 0.2) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
