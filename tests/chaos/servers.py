"""The fleet's servers on their own hosts (network namespaces): a 3-node NATS JetStream cluster
and Redis with a replica and three sentinels, each a real server started as an operator starts it
(``nats-server -c nats.conf``, ``redis-server --bind ... --replicaof ...``, ``redis-server
sentinel.conf --sentinel``), on the host's own address and the standard ports.

A NATS node may keep its store on a disk of its own (``disk=True``: an ext4 image on a loop
device mounted at the store directory), so that a power failure can be played out: ``crash_disk``
copies the image as the device holds it at that instant, which is what survives a power cut (what
the node had fsynced, and what the kernel had already written back); the page cache's dirty pages
are not in it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import redis

from infra.embedded import EmbeddedNats, ServerStartError, find_binary
from tests.chaos.netns import Host, Network

NATS_PORT, ROUTE_PORT, MONITOR_PORT = 4222, 6222, 8222
REDIS_PORT, SENTINEL_PORT = 6379, 26379
SERVICE = "jf"
_DISK_BYTES = 4 << 30  # sparse: only what is written takes room


class HostNats(EmbeddedNats):
    """``nats-server`` inside a host, a node of a cluster; optionally on a disk of its own."""

    def __init__(
        self, host: Host, peers: list[Host], data_dir: Path, sync_interval: str | None, disk: bool
    ) -> None:
        routes = ", ".join(f'"nats://{p.ip}:{ROUTE_PORT}"' for p in peers if p is not host)
        cluster = (
            f'server_name: "{host.name}"\n'
            f'cluster {{ name: "jf", listen: "{host.ip}:{ROUTE_PORT}", routes: [{routes}] }}'
        )
        super().__init__(
            data_dir,
            port=NATS_PORT,
            host=host.ip,
            monitor_port=MONITOR_PORT,
            max_memory_store=1 << 34,
            max_file_store=1 << 40,
            sync_interval=sync_interval,
            extra_config=cluster,
        )
        self.node = host
        self.disk = disk
        self.image = data_dir / "disk.img"
        self.frozen = False

    def _argv(self) -> list[str]:
        if self.disk and not _mounted(self.store_dir):
            self._mount(self.image)
        return self.node.argv(super()._argv())

    def _mount(self, image: Path) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        if not image.exists():
            subprocess.run(["truncate", "-s", str(_DISK_BYTES), str(image)], check=True)
            subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(self.store_dir)], check=True)

    def crash_disk(self) -> None:
        """After the process was killed: the disk becomes what the device held at this instant
        (the page cache's dirty pages are lost, as in a power cut)."""
        snapshot = self.image.with_name("after-power-cut.img")
        shutil.copyfile(self.image, snapshot)  # the device's content now: synced data only
        subprocess.run(["umount", "-l", str(self.store_dir)], check=False)
        self.image.unlink()
        snapshot.rename(self.image)

    def unmount(self) -> None:
        if self.disk:
            subprocess.run(["umount", "-l", str(self.store_dir)], check=False)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.frozen = True

    def resume(self) -> None:
        if self.proc is not None and self.frozen:
            self.proc.send_signal(signal.SIGCONT)
        self.frozen = False

    def monitor(self, path: str) -> dict[str, Any]:
        """A monitoring endpoint read from inside the node's own host (so it answers while the
        node is cut from everyone, the test's clients included)."""
        url = f"{self.monitor_url}{path}"
        argv = self.node.argv(["curl", "-s", "--max-time", "2", url])
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        if done.returncode != 0:
            raise OSError(f"{url}: curl exit {done.returncode}")
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    def _wait_healthz(self, deadline: float) -> None:
        while True:
            with contextlib.suppress(OSError, ValueError):
                if self.monitor("/healthz?js-enabled-only=true").get("status") == "ok":
                    return
            self._check_alive()
            if time.monotonic() > deadline:
                raise ServerStartError(f"nats-server /healthz not ok:\n{self.log_tail()}")
            time.sleep(0.05)

    def streams(self) -> dict[str, dict[str, Any]]:
        """This node's view of every stream it holds a replica of: name -> jsz stream detail."""
        info = self.monitor("/jsz?streams=true")
        return {
            s["name"]: s
            for account in info.get("account_details", [])
            for s in account.get("stream_detail", [])
        }

    def stream_leader(self, stream: str) -> str | None:
        """The server name this node says leads ``stream`` (None: it knows none)."""
        detail = self.streams().get(stream)
        return (detail.get("cluster") or {}).get("leader") if detail else None

    def stream_last_seq(self, stream: str) -> int | None:
        """This node's own last sequence of ``stream`` (None: no replica, or no answer)."""
        with contextlib.suppress(OSError, ValueError):
            detail = self.streams().get(stream)
            return int(detail["state"]["last_seq"]) if detail else None
        return None

    def meta_ready(self) -> bool:
        with contextlib.suppress(OSError, ValueError):
            meta = self.monitor("/jsz").get("meta_cluster") or {}
            return bool(meta.get("leader")) and len(meta.get("replicas") or []) >= 2
        return False


def _mounted(path: Path) -> bool:
    return subprocess.run(["mountpoint", "-q", str(path)], check=False).returncode == 0


class HostRedis:
    """A primary, a replica and three sentinels, each on its own host."""

    def __init__(self, net: Network, data: Host, replica: Host, sentinels: list[Host], tmp: Path):
        self.net, self.tmp = net, tmp
        self.data_hosts = [data, replica]
        self.sentinel_hosts = sentinels
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.first_primary = data

    @property
    def url(self) -> str:
        hosts = ",".join(f"{h.ip}:{SENTINEL_PORT}" for h in self.sentinel_hosts)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self, down_after_ms: int = 2000, timeout_s: float = 60.0) -> None:
        primary, replica = self.data_hosts
        for host in self.data_hosts:
            argv = [find_binary("redis-server"), "--bind", host.ip, "--port", str(REDIS_PORT),
                    "--save", "", "--appendonly", "no", "--protected-mode", "no",
                    "--dir", str(self._dir(host))]  # fmt: skip
            if host is replica:
                argv += ["--replicaof", primary.ip, str(REDIS_PORT)]
            self.procs[host.name] = self.net.spawn(host, argv, self._dir(host) / "redis.log")
        for host in self.sentinel_hosts:
            conf = self._dir(host) / "sentinel.conf"
            conf.write_text(
                f"port {SENTINEL_PORT}\nbind {host.ip}\nprotected-mode no\n"
                f"dir {self._dir(host)}\n"
                f"sentinel monitor {SERVICE} {primary.ip} {REDIS_PORT} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} 10000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            argv = [find_binary("redis-server"), str(conf), "--sentinel"]
            self.procs[host.name] = self.net.spawn(host, argv, self._dir(host) / "sentinel.log")
        deadline = time.monotonic() + timeout_s
        while not self._ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"Redis with sentinels not ready in {timeout_s}s ({self.tmp})")
            time.sleep(0.1)

    def _dir(self, host: Host) -> Path:
        d = self.tmp / host.name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def client(self, host: Host, port: int = REDIS_PORT) -> redis.Redis:
        return redis.Redis(host=host.ip, port=port, socket_timeout=1.0, socket_connect_timeout=1.0)

    def _ready(self) -> bool:
        try:
            with self.client(self.data_hosts[1]) as r:
                if r.info("replication").get("master_link_status") != "up":
                    return False
            for host in self.sentinel_hosts:
                with self.client(host, SENTINEL_PORT) as s:
                    state = s.sentinel_master(SERVICE)
                    if state.get("num-slaves", 0) < 1 or state.get("num-other-sentinels", 0) < 2:
                        return False
        except redis.RedisError:
            return False
        return True

    def primary(self) -> str | None:
        """The primary's address as a majority of the sentinels says (None: no majority)."""
        votes: dict[str, int] = {}
        for host in self.sentinel_hosts:
            with contextlib.suppress(Exception), self.client(host, SENTINEL_PORT) as s:
                addr = s.sentinel_get_master_addr_by_name(SERVICE)
                if addr:
                    ip = addr[0].decode() if isinstance(addr[0], bytes) else str(addr[0])
                    votes[ip] = votes.get(ip, 0) + 1
        best = max(votes.items(), key=lambda kv: kv[1], default=None)
        return best[0] if best is not None and best[1] >= 2 else None

    def role(self, host: Host) -> str:
        with contextlib.suppress(Exception), self.client(host) as r:
            role = r.info("replication").get("role")
            return role.decode() if isinstance(role, bytes) else str(role)
        return "unreachable"

    def writes(self, host: Host) -> int:
        """Write commands this server executed (from INFO commandstats), for counting what a
        deposed primary accepted."""
        with self.client(host) as r:
            stats = r.info("commandstats")
        names = ("evalsha", "eval", "set", "hset", "sadd", "srem", "del", "zadd", "incrby",
                 "hincrby", "expire", "pexpire", "hdel", "zrem", "incr", "decrby")  # fmt: skip
        return sum(int(stats.get(f"cmdstat_{n}", {}).get("calls", 0)) for n in names)
