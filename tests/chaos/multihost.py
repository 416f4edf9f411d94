"""A multi-host jetfleet, each host a network namespace on one bridge (``tests.chaos.netns``),
each running what it runs in production, started with an operator's commands:

    n1 n2 n3     nats-server, a 3-node JetStream cluster (streams at R3: ``jetfleet infra init
                 --replicas 3``)
    r1 r2        redis-server: the primary and its replica
    s1 s2 s3     redis-server --sentinel (quorum 2)
    w1 .. wN     jetfleet worker (mocker engine)
    fe           jetfleet frontend --host <its address> (the OpenAI API on port 8000)
    svc          jetfleet indexer and jetfleet router-service

The test process is host ``clients`` (the root namespace, also on the bridge). Every component
gets ``--nats nats://n1:4222,nats://n2:4222,nats://n3:4222`` and
``--redis redis+sentinel://s1:26379,s2:26379,s3:26379/jf/0``. ``close`` removes every process,
namespace, link and mounted disk, whatever state the faults left them in.

Reusable outside the tests (a benchmark on the same topology): ``with MultiHostFleet(dir) as f``.
"""

from __future__ import annotations

import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

from infra.command import cli_command
from infra.up import serving
from schemas import Subjects
from tests.chaos.netns import Host, Network
from tests.chaos.servers import NATS_PORT, HostNats, HostRedis
from tests.support.up import ready_workers

FRONTEND_PORT = 8000


class MultiHostFleet:
    def __init__(
        self,
        tmp: Path,
        workers: int = 3,
        sync_interval: str | None = "always",  # as the Helm chart's bundled NATS ships
        disks: bool = False,
        worker_flags: tuple[str, ...] = (),
        frontend_flags: tuple[str, ...] = (),
    ) -> None:
        self.tmp = tmp
        self.num_workers = workers
        self.sync_interval = sync_interval
        self.disks = disks
        self.worker_flags = worker_flags
        self.frontend_flags = frontend_flags
        self.net = Network()
        self.nats: list[HostNats] = []
        self.redis: HostRedis | None = None
        self.subjects = Subjects()
        self.components: dict[str, subprocess.Popen[bytes]] = {}
        self.argvs: dict[str, tuple[str, list[str]]] = {}  # name -> (host, argv)
        self.restarts: dict[str, int] = {}  # as a process supervisor (systemd, k8s) would
        self._stop = threading.Event()

    # ------------------------------------------------------------------ topology
    @property
    def nats_url(self) -> str:
        return ",".join(f"nats://{n.node.ip}:{NATS_PORT}" for n in self.nats)

    @property
    def redis_url(self) -> str:
        assert self.redis is not None
        return self.redis.url

    @property
    def base_url(self) -> str:
        return f"http://{self.host('fe').ip}:{FRONTEND_PORT}"

    @property
    def worker_hosts(self) -> list[str]:
        return [f"w{i + 1}" for i in range(self.num_workers)]

    def host(self, name: str) -> Host:
        return self.net.hosts[name]

    def node(self, name: str) -> HostNats:
        return next(n for n in self.nats if n.node.name == name)

    # ------------------------------------------------------------------ start / stop
    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> None:
        net = self.net
        net.open()
        names = ["n1", "n2", "n3", "r1", "r2", "s1", "s2", "s3", *self.worker_hosts, "fe", "svc"]
        for name in names:
            net.add_host(name)
        peers = [self.host(n) for n in ("n1", "n2", "n3")]
        for host in peers:
            node = HostNats(host, peers, self.tmp / host.name, self.sync_interval, self.disks)
            self.nats.append(node)
        for node in self.nats:
            node.start(timeout_s=60)
        self.wait_nats_cluster()
        sentinels = [self.host(n) for n in ("s1", "s2", "s3")]
        self.redis = HostRedis(net, self.host("r1"), self.host("r2"), sentinels, self.tmp)
        self.redis.start()
        init = cli_command("infra", "init", "--nats", self.nats_url, "--replicas", "3")
        done = subprocess.run(init, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        for name in self.worker_hosts:
            self.start_worker(name)
        common = ["--nats", self.nats_url, "--redis", self.redis_url]
        self.run("svc", "indexer", cli_command("indexer", *common, "--metrics-port", "0"))
        self.run("svc", "router", cli_command("router-service", *common, "--metrics-port", "0"))
        fe = self.host("fe")
        argv = cli_command("frontend", *common, "--host", fe.ip, "--port", str(FRONTEND_PORT),
                           *self.frontend_flags)  # fmt: skip
        self.run("fe", "frontend", argv)
        threading.Thread(target=self._supervise, name="supervisor", daemon=True).start()
        self.wait_ready(self.num_workers)

    def start_worker(self, name: str) -> None:
        argv = cli_command("worker", "--nats", self.nats_url, "--worker-id", name,
                           "--metrics-port", "-1", *self.worker_flags)  # fmt: skip
        self.run(name, name, argv)

    def run(self, host: str, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        proc = self.net.spawn(self.host(host), argv, self.tmp / "logs" / f"{name}.log")
        self.components[name] = proc
        self.argvs[name] = (host, argv)
        return proc

    def _supervise(self) -> None:
        """Restart a component that exits, 1 s later (``Restart=always``, a pod's restart
        policy): a process that gives up on a dependency at start-up is brought back, as in
        production; ``restarts`` counts it for the report."""
        while not self._stop.wait(1.0):
            for name, proc in list(self.components.items()):
                if proc.poll() is not None and not self._stop.is_set():
                    self.restarts[name] = self.restarts.get(name, 0) + 1
                    self.run(*self.argvs[name][:1], name, self.argvs[name][1])

    def log(self, name: str) -> str:
        return (self.tmp / "logs" / f"{name}.log").read_text(errors="replace")

    def count_in_logs(self, word: str, names: list[str]) -> int:
        return sum(self.log(name).count(word) for name in names)

    def lines_about(self, word: str, most: int = 40) -> list[str]:
        """Every component's log lines that mention ``word`` (a request id), each with its
        component's name, the first ``most``: what a failed run's message shows of a request."""
        out = []
        for path in sorted((self.tmp / "logs").glob("*.log")):
            for line in path.read_text(errors="replace").splitlines():
                if word in line:
                    out.append(f"{path.stem}: {line[:400]}")
        return out[:most]

    def wait_nats_cluster(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(n.meta_ready() for n in self.nats if n.running):
            if time.monotonic() > deadline:
                raise TimeoutError("the NATS cluster elected no JetStream leader")
            time.sleep(0.1)

    def wait_ready(self, workers: int, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            looping = [n for n, k in self.restarts.items() if k >= 5]
            assert not looping, f"{looping} keep exiting: {self.log(looping[0])[-3000:]}"
            if self._frontend_ready() and len(ready_workers(self.nats_url)) >= workers:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the fleet was not ready in {timeout_s}s (logs: {self.tmp})")
            time.sleep(0.3)

    def _frontend_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/ready", timeout=2) as r:
                return r.status == 200 and serving(r.read())
        except OSError:
            return False

    def stream_leader(self, stream: str) -> HostNats:
        for node in self.nats:
            if node.running and not node.frozen:
                leader = node.stream_leader(self.subjects.stream_name(stream))
                if leader:
                    return self.node(leader)
        raise LookupError(f"no node names a leader of {stream}")

    def close(self) -> None:
        self._stop.set()
        self.net.close()  # every process in every namespace, then the namespaces
        for node in self.nats:
            node.proc = None
            node.unmount()
