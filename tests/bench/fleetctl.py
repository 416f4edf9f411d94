"""Bring up a private fleet for a benchmark: embedded servers and component processes."""

from __future__ import annotations

import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from base.ports import free_port
from base.process import ProcessGroup, wait_http_ok
from infra.command import cli_command
from infra.embedded import EmbeddedNats, EmbeddedRedis
from tests.support.nats_cluster import NatsCluster
from tests.support.up import ready_workers


@dataclass
class BenchFleet:
    workers: int = 1
    worker_args: tuple[str, ...] = ()
    router: str = "round-robin"
    frontend_args: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()  # one worker per role given (instead of ``workers`` agg ones)
    nats_nodes: int = 1  # 3: a NATS cluster on loopback, every stream at R3
    nats_sync_interval: str | None = None  # JetStream's fsync policy (None: the server default)
    url: str = ""
    pids: dict[str, int] = field(default_factory=dict)

    def __enter__(self) -> BenchFleet:
        try:
            return self._start()
        except BaseException:  # a fleet that did not come up leaves nothing running
            self.__exit__(None, None, None)
            raise

    def _start(self) -> BenchFleet:
        self._tmp = tempfile.TemporaryDirectory(prefix="jetfleet-bench-")
        tmp = Path(self._tmp.name)
        if self.nats_nodes > 1:
            self.cluster = NatsCluster(tmp / "nats", self.nats_nodes, self.nats_sync_interval)
            self.cluster.start()
            nats_url = self.cluster.url
            init = cli_command("infra", "init", "--nats", nats_url, "--replicas", "3")
            subprocess.run(init, check=True, capture_output=True, timeout=120)
        else:
            self.nats = EmbeddedNats(tmp / "nats", port=0, sync_interval=self.nats_sync_interval)
            self.nats.start()
            nats_url = self.nats.url
        self.redis = EmbeddedRedis(tmp / "redis", port=0)
        self.redis.start()
        self.group = ProcessGroup(tmp / "logs")
        common = ["--nats", nats_url, "--log-level", "warning"]
        roles = self.roles or ("agg",) * self.workers
        for i, role in enumerate(roles):
            argv = cli_command("worker", *common, "--role", role, *self.worker_args)
            self.group.start(f"worker-{i}", argv)
        if self.router == "kv":
            self.group.start("indexer", cli_command("indexer", *common, "--redis", self.redis.url))
        port = free_port()
        self.group.start(
            "frontend",
            cli_command(
                "frontend",
                *common,
                "--port",
                str(port),
                "--router",
                self.router,
                "--redis",
                self.redis.url,
                "--max-waiting-per-worker",
                "100000",
                *self.frontend_args,
            ),
        )
        self.url = f"http://127.0.0.1:{port}"
        wait_http_ok(f"{self.url}/ready", 60, self.group)
        self._wait_registered(nats_url, len(roles), 60)
        self.pids = {name: c.proc.pid for name, c in self.group.children.items()}
        if self.nats_nodes > 1:
            for i, node in enumerate(self.cluster.nodes):
                self.pids[f"nats-server-{i}"] = node.pid
        else:
            self.pids["nats-server"] = self.nats.pid
        self.pids["redis-server"] = self.redis.pid
        return self

    def _wait_registered(self, nats_url: str, n: int, timeout_s: float) -> None:
        """Until all ``n`` workers are registered and ready: the frontend is ready with the first
        one, and a run started then put its first burst on fewer workers (a split fleet's first
        requests found no prefill worker and prefilled locally)."""
        deadline = time.monotonic() + timeout_s
        while True:
            rows = ready_workers(nats_url)
            if len(rows) >= n:
                return
            if dead := self.group.exited():
                tail = dead[0].log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{dead[0].name} exited during start-up:\n{tail}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{n} workers not registered within {timeout_s}s: {rows}")
            time.sleep(0.2)

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if hasattr(self, "group"):  # absent when start-up failed before it
            self.group.stop_all(timeout_s=20)
        for server in (getattr(self, "redis", None), getattr(self, "nats", None)):
            if server is not None:
                server.stop()
        if hasattr(self, "cluster"):
            self.cluster.stop()
        self._tmp.cleanup()
