"""The servers and processes of one index-scale configuration: a private nats-server, a Redis
(or a Redis Cluster of ``masters`` nodes), the registrations of the fake workers (kept fresh),
``jetfleet indexer`` processes, and the index's applied positions as the routers see them.

Markers: a batch of one ``ShapeChanged`` from a marker worker per indexer group (a worker id in
that group's partitions), published with an acknowledgement; when every group's position has
reached its marker's sequence, everything published before is applied. (A group's position is
the last sequence of its own partitions it applied, so a marker per group is what tells.)
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.js.errors import NotFoundError

from base.connect import close_nats, connect_nats, connect_redis
from base.ports import free_port
from base.process import Child, ProcessGroup
from base.topology import ensure_topology
from infra.command import cli_command
from infra.embedded import EmbeddedNats, EmbeddedRedis
from infra.embedded_cluster import EmbeddedRedisCluster
from router.kv.keys import namespace
from router.kv.redis_index import RedisPrefixIndex
from schemas import Subjects, WorkerRegistration, encode
from schemas.kv_events import KvEventBatch, ShapeChanged
from schemas.streams import HEARTBEATS_BUCKET, WORKERS_BUCKET
from schemas.subjects import KV_PARTITIONS, kv_partition

HEARTBEAT_EVERY_S = 10.0  # the heartbeats bucket forgets an entry after 30 s (its max age)


@dataclass
class Indexer:
    child: Child
    metrics_url: str

    @property
    def pid(self) -> int:
        return self.child.proc.pid

    def metrics(self) -> dict[str, float]:
        """The indexer's own metrics (name -> value, labels dropped, summed), {} if it does not
        answer."""
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=1.0) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("jetfleet_indexer") and " " in line:
                name, value = line.rsplit(" ", 1)
                name = name.split("{", 1)[0]
                out[name] = out.get(name, 0.0) + float(value)
        return out


@dataclass
class Env:
    root: Path
    masters: int  # 0: one plain redis-server
    groups: int
    model: str = "m"
    prefix: str = "fleet"
    leader_ttl_ms: int = 5000
    nats: EmbeddedNats | None = None
    redis: EmbeddedRedis | None = None
    cluster: EmbeddedRedisCluster | None = None
    procs: ProcessGroup | None = None
    indexers: dict[str, Indexer] = field(default_factory=dict)
    departed: set[str] = field(default_factory=set)
    nc: NATS | None = None
    client: Any = None
    index: RedisPrefixIndex | None = None
    _registered: dict[str, WorkerRegistration] = field(default_factory=dict)
    _markers: dict[int, tuple[str, int]] = field(default_factory=dict)  # group -> id, event id
    _heartbeat: asyncio.Task[None] | None = None

    @property
    def subjects(self) -> Subjects:
        return Subjects(self.prefix)

    @property
    def ns(self) -> str:
        return namespace(self.prefix)

    @property
    def nats_url(self) -> str:
        assert self.nats is not None
        return self.nats.url

    @property
    def redis_url(self) -> str:
        """The Redis URL the components get: a seed node's of a cluster (the index finds it)."""
        if self.cluster is not None:
            return self.cluster.url
        assert self.redis is not None
        return self.redis.url

    def redis_nodes(self) -> list[tuple[str, int, str]]:
        """(name, pid, url) of every redis-server."""
        if self.cluster is not None:
            return [(f"redis-{i}", n.pid, n.url) for i, n in enumerate(self.cluster.nodes)]
        assert self.redis is not None
        return [("redis-0", self.redis.pid, self.redis.url)]

    # ------------------------------------------------------------------ life
    async def start(self) -> None:
        """Start the servers (in this thread: a server dies with the thread that started it)."""
        self.nats = EmbeddedNats(self.root / "nats", port=0)
        self.nats.start()
        if self.masters:
            self.cluster = EmbeddedRedisCluster(self.root / "redis", masters=self.masters)
            self.cluster.start()
        else:
            self.redis = EmbeddedRedis(self.root / "redis", port=0)
            self.redis.start()
        self.procs = ProcessGroup(self.root / "logs")
        self.nc = await connect_nats(self.nats_url, name="index-scale-driver")
        await ensure_topology(self.nc.jetstream(), self.subjects)
        self.client = await connect_redis(self.redis_url)
        self._heartbeat = asyncio.create_task(self._beat())

    async def stop(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self.procs is not None:
            self.procs.stop_all(timeout_s=10)
        if self.index is not None:
            await self.index.aclose()
        if self.client is not None:
            await self.client.aclose()
        if self.nc is not None:
            await close_nats(self.nc)
        for server in (self.cluster, self.redis, self.nats):
            if server is not None:
                server.stop()

    async def read_index(self) -> RedisPrefixIndex:
        """The driver's index client (a router's: it reads the layout the indexer recorded)."""
        if self.index is None:
            self.index = RedisPrefixIndex(self.client, self.ns)
            await self.index.ready()
        return self.index

    # ------------------------------------------------------------------ workers
    async def register(self, workers: list[str]) -> None:
        now = time.time()
        for w in workers:
            self._registered[w] = WorkerRegistration(
                w, self.model, "agg", "mocker", 64, 100_000, 16, started_at_s=now, ttl_s=3600
            )
        await self._put(workers)

    async def deregister(self, worker: str) -> None:
        """The worker leaves discovery (its key deleted), as a clean shutdown does."""
        assert self.nc is not None
        self.departed.add(worker)
        for bucket in (WORKERS_BUCKET, HEARTBEATS_BUCKET):
            kv = await self.nc.jetstream().key_value(self.subjects.bucket_name(bucket))
            await kv.delete(worker)

    async def _put(self, workers: list[str]) -> None:
        assert self.nc is not None
        kv = await self.nc.jetstream().key_value(self.subjects.bucket_name(HEARTBEATS_BUCKET))
        now = time.time()
        for w in workers:
            if w in self.departed:
                continue
            reg = self._registered[w]
            await kv.put(w, encode(_beat_at(reg, now)))

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_EVERY_S)
            with contextlib.suppress(Exception):
                await self._put(list(self._registered))

    # ------------------------------------------------------------------ indexers
    def start_indexer(self, name: str, *flags: str) -> Indexer:
        assert self.procs is not None
        port = free_port()
        argv = cli_command(
            "indexer", "--nats", self.nats_url, "--redis", self.redis_url,
            "--subject-prefix", self.prefix, "--indexer-groups", str(self.groups),
            "--leader-ttl-ms", str(self.leader_ttl_ms), "--metrics-port", str(port), *flags,
        )  # fmt: skip
        ix = Indexer(self.procs.start(name, argv), f"http://127.0.0.1:{port}/metrics")
        self.indexers[name] = ix
        return ix

    async def wait_serving(self, ix: Indexer, leading: bool, timeout_s: float = 60.0) -> None:
        """Until the indexer answers (as the leader of a group if ``leading``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ix.child.proc.poll() is not None:
                raise RuntimeError(f"indexer exited, see {ix.child.log_path}")
            m = await asyncio.to_thread(ix.metrics)
            if m and (not leading or m.get("jetfleet_indexer_leader") == 1.0):
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"indexer not {'leading' if leading else 'up'} in {timeout_s}s")

    async def start_indexers(self, n: int, *flags: str) -> list[Indexer]:
        """``n`` indexers, the first ``groups`` of them leading (one group each), the rest
        standing by."""
        out = []
        for i in range(n):
            ix = self.start_indexer(f"indexer-{len(self.indexers)}", *flags)
            await self.wait_serving(ix, leading=i < self.groups)
            out.append(ix)
        return out

    def stop_indexers(self) -> None:
        assert self.procs is not None
        for name in list(self.indexers):
            self.procs.stop(name, timeout_s=20)
        self.indexers.clear()

    def kill_indexer(self, ix: Indexer) -> None:
        ix.child.proc.send_signal(signal.SIGKILL)

    # ------------------------------------------------------------------ positions
    async def positions(self) -> list[int]:
        """Each group's applied position (the lowest over the shards)."""
        index = await self.read_index()
        groups = [str(g) for g in range(self.groups)]
        low = [1 << 62] * self.groups
        for s in index.shards.shards:
            got = await s.call("HMGET", s.keys.pos, *groups)
            low = [min(a, int(b or 0)) for a, b in zip(low, got, strict=True)]
        return low

    async def last_seq(self) -> int:
        assert self.nc is not None
        info = await self.nc.jetstream().stream_info(self.subjects.stream_name("KV"))
        return int(info.state.last_seq)

    async def tails(self) -> list[int]:
        """Where the stream ends for each group: the last sequence of its partitions (with one
        group, of the stream), the partitions asked at once."""
        if self.groups == 1:
            return [await self.last_seq()]
        assert self.nc is not None
        js = self.nc.jetstream()
        stream = self.subjects.stream_name("KV")

        async def last(p: int) -> int:
            with contextlib.suppress(NotFoundError):
                msg = await js.get_last_msg(stream, self.subjects.kv_partitions([p])[0])
                return int(msg.seq or 0)
            return 0

        seqs = await asyncio.gather(*(last(p) for p in range(KV_PARTITIONS)))
        return [max(seqs[g :: self.groups]) for g in range(self.groups)]

    async def wait_stored(self, seq: int, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while await self.last_seq() < seq:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the stream did not reach {seq}")
            await asyncio.sleep(0.05)

    def marker_workers(self) -> list[str]:
        out = []
        for g in range(self.groups):
            n = 0
            while kv_partition(f"mark{n}") % self.groups != g:
                n += 1
            out.append(f"mark{n}")
        return out

    async def markers(self) -> list[int]:
        """Publish one marker per group; their stream sequences."""
        assert self.nc is not None
        js = self.nc.jetstream()
        seqs = []
        for g, w in enumerate(self.marker_workers()):
            _, last = self._markers.get(g, (w, 0))
            self._markers[g] = (w, last + 1)
            batch = KvEventBatch(w, self.model, last + 1, time.time(), (ShapeChanged(True),))
            ack = await js.publish(self.subjects.kv(self.model, w), encode(batch))
            seqs.append(int(ack.seq))
        return seqs

    async def wait_applied(self, seqs: list[int], timeout_s: float = 600.0) -> float:
        """Until every group reached its marker; returns when (monotonic)."""
        deadline = time.monotonic() + timeout_s
        while True:
            pos = await self.positions()
            if all(p >= s for p, s in zip(pos, seqs, strict=True)):
                return time.monotonic()
            if time.monotonic() > deadline:
                raise TimeoutError(f"positions {pos} did not reach {seqs}")
            await asyncio.sleep(0.005)

    async def drain(self, timeout_s: float = 600.0) -> float:
        """Until everything published so far is applied."""
        return await self.wait_applied(await self.markers(), timeout_s)


def _beat_at(reg: WorkerRegistration, now: float) -> WorkerRegistration:
    return msgspec.structs.replace(reg, heartbeat_at_s=now)


def ready_and_wait_go(ready: Path, go: Path, timeout_s: float = 600.0) -> float:
    """A child's side of the start handshake: say it is ready (its batches or calls built),
    then wait for the driver's start time (monotonic, the same clock in every process here)."""
    ready.write_text("ready")
    deadline = time.monotonic() + timeout_s
    while not go.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("no start from the driver")
        time.sleep(0.005)
    return float(go.read_text())


async def wait_ready(paths: list[Path], children: list[Child], timeout_s: float = 600.0) -> None:
    """The driver's side: until every child wrote its ready file."""
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        for c in children:
            if c.proc.poll() is not None:
                raise RuntimeError(f"{c.name} exited early, see {c.log_path}")
        if time.monotonic() > deadline:
            raise TimeoutError("children not ready")
        await asyncio.sleep(0.05)


def go(paths: list[Path], lead_s: float = 0.3) -> float:
    """Tell the children to start at a moment ``lead_s`` from now; returns it."""
    t0 = time.monotonic() + lead_s
    for p in paths:
        tmp = p.with_suffix(".tmp")
        tmp.write_text(repr(t0))
        tmp.rename(p)
    return t0
