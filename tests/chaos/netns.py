"""Hosts as Linux network namespaces on one bridge, with links that can be cut and healed.

Each ``Host`` is a namespace ``jf-{owner pid}{run letter}-{name}`` with one veth into the
bridge ``jfb{owner pid}{run letter}`` and its own address in a /24 chosen per run; the machine
itself (the root namespace: the test's clients) has an address on the bridge too, as host
``CLIENTS``. Processes run inside a host with ``ip netns exec`` (the same pid: it execs), each in
its own process group, and die with this process (``PR_SET_PDEATHSIG``).

A cut between two hosts drops every packet between them, silently, as a switch that lost a link:
each side gets a permanent neighbour entry that sends the other's address to a MAC nobody has, so
TCP connections stall and time out instead of failing fast (as a blackhole route would make them).
Only ``iproute2`` is needed (no iptables, no ``tc netem``). ``heal`` deletes those entries.

Everything this makes is removed by ``close`` (process groups killed, namespaces and the bridge
deleted), called by the test's finalizer and by ``atexit``; ``sweep_stale`` removes what an
earlier run left behind when its owner process is gone. Needs root: ``require_netns`` fails with
a plain message where ``ip netns`` is not permitted.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from base.process import die_with_parent

_RUNS = itertools.count()  # one letter per Network of this process: names never reused at once
CLIENTS = "clients"  # the root namespace: the test process and its load generators
_BOGUS_MAC = "02:00:00:00:de:ad"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def require_netns() -> None:
    """Fail (not skip) with a clear message when this machine cannot make network namespaces."""
    probe = f"jf-probe-{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            "the multi-host chaos harness needs root and `ip netns` (iproute2): "
            f"`ip netns add` failed: {done.stderr.strip()}"
        )
    _ip("netns", "del", probe, check=False)


def sweep_stale() -> list[str]:
    """Delete the namespaces and bridges of earlier runs whose owner process is gone."""
    removed = []
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    for name in (line.split()[0] for line in listed if line.startswith("jf-")):
        owner = name.split("-")[1][:-1]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            _kill_namespace_pids(name)
            _ip("netns", "del", name, check=False)
            removed.append(name)
    for line in _ip("-o", "link", "show", "type", "bridge", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        owner = name[3:-1]
        if name.startswith("jfb") and owner.isdigit() and not Path(f"/proc/{owner}").exists():
            _ip("link", "del", name, check=False)
            removed.append(name)
    return removed


def _kill_namespace_pids(ns: str) -> None:
    pids = _ip("netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


@dataclass
class Host:
    name: str
    ns: str  # "" for the root namespace (CLIENTS)
    ip: str
    veth: str = ""

    def argv(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *argv] if self.ns else list(argv)


@dataclass
class Network:
    """A bridge and its hosts; ``close`` removes everything (idempotent)."""

    owner: int = field(default_factory=os.getpid)
    run: str = field(default_factory=lambda: "abcdefghijklmnopqrstuvwxyz"[next(_RUNS) % 26])
    hosts: dict[str, Host] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    cuts: set[frozenset[str]] = field(default_factory=set)
    subnet: str = ""
    _closed: bool = False

    @property
    def bridge(self) -> str:
        return f"jfb{self.owner}{self.run}"

    def open(self) -> None:
        require_netns()
        sweep_stale()
        atexit.register(self.close)
        self.subnet = self._free_subnet()
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        self.hosts[CLIENTS] = Host(CLIENTS, "", f"{self.subnet}.1")

    @staticmethod
    def _free_subnet() -> str:
        used = _ip("-4", "-o", "addr", check=False).stdout
        for _ in range(200):
            subnet = f"10.{random.randint(160, 223)}.{random.randint(0, 255)}"
            if f" {subnet}." not in used:
                return subnet
        raise RuntimeError("no free 10.x.y.0/24 for the test network")

    def add_host(self, name: str) -> Host:
        i = len(self.hosts) + 1
        ns, veth = f"jf-{self.owner}{self.run}-{name}", f"jf{self.owner}{self.run}{i}"
        ip = f"{self.subnet}.{i + 1}"
        host = Host(name, ns, ip, veth)
        self.hosts[name] = host  # from now on close() removes it, even if the rest fails
        _ip("netns", "add", ns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
        _ip("link", "set", f"{veth}p", "netns", ns)
        _ip("link", "set", veth, "master", self.bridge, "up")
        inside = ["-n", ns]
        _ip(*inside, "link", "set", f"{veth}p", "name", "eth0")
        _ip(*inside, "addr", "add", f"{ip}/24", "dev", "eth0")
        _ip(*inside, "link", "set", "eth0", "up")
        _ip(*inside, "link", "set", "lo", "up")
        return host

    def spawn(
        self, host: Host, argv: list[str], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """``argv`` inside ``host``, in its own process group, output appended to ``log``."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(
                host.argv(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        self.procs.append(proc)
        return proc

    # ------------------------------------------------------------------ faults
    def _neigh(self, op: str, host: Host, peer: Host) -> None:
        where = ["-n", host.ns] if host.ns else []
        dev = "eth0" if host.ns else self.bridge
        if op == "cut":
            _ip(*where, "neigh", "replace", peer.ip, "lladdr", _BOGUS_MAC, "nud", "permanent",
                "dev", dev)  # fmt: skip
        else:
            _ip(*where, "neigh", "del", peer.ip, "dev", dev, check=False)

    def cut(self, side_a: list[str], side_b: list[str]) -> None:
        """Drop every packet between each host of ``side_a`` and each of ``side_b``."""
        for a, b in itertools.product(side_a, side_b):
            if a == b or frozenset((a, b)) in self.cuts:
                continue
            self._neigh("cut", self.hosts[a], self.hosts[b])
            self._neigh("cut", self.hosts[b], self.hosts[a])
            self.cuts.add(frozenset((a, b)))

    def isolate(self, names: list[str]) -> None:
        """Cut ``names`` (a minority) from every other host, clients included."""
        self.cut(names, [h for h in self.hosts if h not in names])

    def heal(self) -> None:
        for pair in list(self.cuts):
            a, b = sorted(pair)
            self._neigh("heal", self.hosts[a], self.hosts[b])
            self._neigh("heal", self.hosts[b], self.hosts[a])
            self.cuts.discard(pair)

    def reachable(self, src: str, dst: str, port: int, timeout_s: float = 1.0) -> bool:
        """A TCP connect from ``src`` to ``dst:port`` succeeds (run inside ``src``)."""
        code = (
            "import socket,sys\n"
            f"s=socket.create_connection(({self.hosts[dst].ip!r},{port}),timeout={timeout_s})\n"
        )
        argv = self.hosts[src].argv(["python3", "-c", code])
        return subprocess.run(argv, capture_output=True, timeout=timeout_s + 10).returncode == 0

    # ------------------------------------------------------------------ cleanup
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for proc in self.procs:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(Exception):
                proc.wait(10)
        for host in self.hosts.values():
            if host.ns:
                _kill_namespace_pids(host.ns)
                _ip("link", "del", host.veth, check=False)  # both ends, now
                _ip("netns", "del", host.ns, check=False)
        _ip("link", "del", self.bridge, check=False)
        deadline = time.monotonic() + 5
        while self._leftovers() and time.monotonic() < deadline:
            time.sleep(0.05)

    def _leftovers(self) -> list[str]:
        listed = _ip("netns", "list", check=False).stdout
        return [h.ns for h in self.hosts.values() if h.ns and h.ns in listed]
