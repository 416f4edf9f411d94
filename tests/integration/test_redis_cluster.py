"""The embedded Redis Cluster (``infra.embedded_cluster``) is a real one: formed with the even slot
split, it agrees with ``base.redis_slots`` on every key's slot, runs a Lua script whose keys
share a hash tag on the node owning it and refuses one spanning two slots, redirects a key asked
of the wrong node, and takes a stopped node back."""

from __future__ import annotations

import functools
import random
import socket
import uuid
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster
from redis.exceptions import ClusterCrossSlotError, MovedError

from base.ports import free_port
from base.redis_slots import key_slot, slot_range, tag_for_range
from infra.embedded_cluster import (
    CLUSTER_BUS_OFFSET,
    ClusterNode,
    EmbeddedRedisCluster,
    parse_cluster_nodes,
)
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

MASTERS = 3
# one script, two declared keys: SETs both, returns both
SET_BOTH = (
    "redis.call('SET', KEYS[1], ARGV[1]); redis.call('SET', KEYS[2], ARGV[1]); "
    "return redis.call('MGET', KEYS[1], KEYS[2])"
)


def client(node: ClusterNode) -> redis.Redis:
    """A client of this node alone: it follows no redirection."""
    return redis.Redis.from_url(node.url)


def owner(key: str) -> int:
    """The node the even split gives ``key``'s slot to."""
    return next(i for i in range(MASTERS) if key_slot(key) < slot_range(i, MASTERS)[1])


def test_the_cluster_forms_with_the_even_slot_split(redis_cluster: EmbeddedRedisCluster) -> None:
    ports = [node.port for node in redis_cluster.nodes]
    assert len(set(ports)) == MASTERS and redis_cluster.url == redis_cluster.urls[0]
    for node in redis_cluster.nodes:
        with client(node) as r:
            info = r.execute_command("CLUSTER", "INFO").decode()
            assert "cluster_state:ok" in info and f"cluster_known_nodes:{MASTERS}" in info
            served = {
                line.port: line.slots
                for line in parse_cluster_nodes(r.execute_command("CLUSTER", "NODES").decode())
            }
        assert served == {port: (slot_range(i, MASTERS),) for i, port in enumerate(ports)}


def _random_keys(rng: random.Random, n: int) -> list[bytes]:
    braces = b"{}{}ab.:"
    keys = []
    for i in range(n):
        length = rng.randrange(0, 24)
        if i % 3 == 0:  # any bytes
            key = bytes(rng.randrange(256) for _ in range(length))
        else:  # mostly braces: tags, empty tags, unclosed ones, several
            key = bytes(rng.choice(braces + b"xyz019") for _ in range(length))
        if i % 5 == 0:
            key = b"{" + key[:6] + b"}" + key[6:]
        keys.append(key)
    return keys


def test_cluster_keyslot_agrees_with_key_slot(redis_cluster: EmbeddedRedisCluster) -> None:
    keys = _random_keys(random.Random(20261128), 400)
    keys += [t.encode() + b":x" for t in (tag_for_range("kv", *slot_range(i, 3)) for i in range(3))]
    with client(redis_cluster.nodes[1]) as r:
        pipe = r.pipeline(transaction=False)
        for key in keys:
            pipe.execute_command("CLUSTER", "KEYSLOT", key)
        answered = pipe.execute()
    assert sum(b"{" in k and b"}" in k for k in keys) > 150  # tags were tried
    assert [key_slot(k) for k in keys] == answered


def test_a_script_runs_on_the_node_owning_its_tag_and_nowhere_else(
    redis_cluster: EmbeddedRedisCluster,
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    for i, node in enumerate(redis_cluster.nodes):
        tag = tag_for_range(prefix, *slot_range(i, MASTERS))
        keys = [f"{tag}:a", f"{tag}:b"]
        with client(node) as r:
            assert r.eval(SET_BOTH, 2, *keys, str(i)) == [str(i).encode()] * 2
        other = redis_cluster.nodes[(i + 1) % MASTERS]
        with client(other) as r, pytest.raises(MovedError) as moved:
            r.eval(SET_BOTH, 2, *keys, "elsewhere")
        assert moved.value.node_addr == (node.host, node.port)
        assert moved.value.slot_id == key_slot(tag)


def test_a_script_across_two_slots_fails_with_crossslot(
    redis_cluster: EmbeddedRedisCluster,
) -> None:
    """Two tags in node 1's range, so one node owns both slots: still refused."""
    lo, hi = slot_range(1, MASTERS)
    a, b = tag_for_range(f"a{uuid.uuid4().hex[:8]}", lo, hi), tag_for_range("b", lo, hi)
    assert key_slot(a) != key_slot(b)
    with client(redis_cluster.nodes[1]) as r, pytest.raises(ClusterCrossSlotError):
        r.eval(SET_BOTH, 2, f"{a}:k", f"{b}:k", "x")


def test_a_key_written_at_its_node_is_moved_when_asked_elsewhere(
    redis_cluster: EmbeddedRedisCluster,
) -> None:
    for i, home in enumerate(redis_cluster.nodes):
        key = f"moved-{uuid.uuid4().hex}"
        while owner(key) != i:  # a plain key (no tag) that the split gives node i
            key = f"moved-{uuid.uuid4().hex}"
        with client(home) as r:
            assert r.set(key, "here") and r.get(key) == b"here"
        for node in redis_cluster.nodes:
            if node is not home:
                with client(node) as r, pytest.raises(MovedError) as moved:
                    r.get(key)
                assert moved.value.node_addr == (home.host, home.port)


def test_any_node_is_a_seed_for_a_cluster_client(redis_cluster: EmbeddedRedisCluster) -> None:
    keys = [
        f"{tag_for_range('seed', *slot_range(i, MASTERS))}:{uuid.uuid4().hex}" for i in range(3)
    ]
    for url in redis_cluster.urls:
        with RedisCluster.from_url(url) as rc:
            for key in keys:
                rc.set(key, url)
                assert rc.get(key) == url.encode()


def test_a_stopped_node_rejoins_when_restarted(tmp_path: Path) -> None:
    with EmbeddedRedisCluster(tmp_path, masters=MASTERS) as cluster:
        kept, lost = (f"{tag_for_range('r', *slot_range(i, MASTERS))}:k" for i in (0, 2))
        with client(cluster.nodes[0]) as r0, client(cluster.nodes[2]) as r2:
            assert r0.set(kept, "1") and r2.set(lost, "1")
        cluster.stop_node(2)

        def node0_sees_node2_failed() -> bool:
            with client(cluster.nodes[0]) as r:
                seen = parse_cluster_nodes(r.execute_command("CLUSTER", "NODES").decode())
            return any(line.port == cluster.nodes[2].port and "fail" in line.flags for line in seen)

        wait_until(node0_sees_node2_failed, 15, "node 2 marked failed")
        assert not cluster.formed()
        # cluster-require-full-coverage no: the other masters go on serving their slots
        with client(cluster.nodes[0]) as r:
            assert "cluster_state:ok" in r.execute_command("CLUSTER", "INFO").decode()
            assert r.get(kept) == b"1" and r.set(kept, "2")
            with pytest.raises(MovedError):  # node 2's slots stay node 2's
                r.get(lost)

        cluster.start_node(2)
        assert cluster.formed()
        with client(cluster.nodes[2]) as r:
            assert "cluster_state:ok" in r.execute_command("CLUSTER", "INFO").decode()
            assert r.get(lost) is None  # back empty: nothing is persisted
            assert r.set(lost, "again") and r.get(lost) == b"again"


def _consecutive_free_ports(count: int) -> int:
    """A port ``p`` with ``p .. p+count-1`` and their bus ports (+10000) free now."""

    def free(port: int) -> bool:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
        return True

    def candidate() -> int | None:
        base = free_port(bus_offset=CLUSTER_BUS_OFFSET)
        wanted = [base + i + bus for i in range(count) for bus in (0, CLUSTER_BUS_OFFSET)]
        return base if all(free(port) for port in wanted) else None

    port: int = wait_until(candidate, 10, "consecutive free ports", interval=0)
    return port


def test_a_cluster_restarted_whole_keeps_its_nodes_and_a_new_one_forms_afresh(
    tmp_path: Path,
) -> None:
    base = _consecutive_free_ports(2)
    cluster = EmbeddedRedisCluster(tmp_path, masters=2, base_port=base)
    with cluster:
        assert [node.port for node in cluster.nodes] == [base, base + 1]
        ids = [node.command("CLUSTER", "MYID") for node in cluster.nodes]
    with cluster:  # stop(), start(): the same nodes (nodes.conf kept) find each other again
        assert [node.command("CLUSTER", "MYID") for node in cluster.nodes] == ids
    # another cluster in the same directory, on other ports: the stale nodes.conf is not reused
    with EmbeddedRedisCluster(tmp_path, masters=2) as again:
        assert [node.port for node in again.nodes] != [base, base + 1]
        assert not {node.command("CLUSTER", "MYID") for node in again.nodes} & set(ids)


def _holds(r: redis.Redis, key: str, value: bytes) -> bool:
    return bool(r.get(key) == value)


async def test_a_cluster_with_replicas_forms_and_replicates(tmp_path: Path) -> None:
    cluster = EmbeddedRedisCluster(tmp_path, masters=MASTERS, replicas_per_master=1)
    await cluster.start_async()
    try:
        assert len(cluster.nodes) == 2 * MASTERS
        for index in range(MASTERS, 2 * MASTERS):
            master, replica = cluster.nodes[cluster.master_of(index)], cluster.nodes[index]
            assert replica.replication()["role"] == "slave"
            assert replica.replication()["master_port"] == master.port
            key = f"{tag_for_range('rep', *slot_range(cluster.master_of(index), MASTERS))}:k"
            with client(master) as r:
                r.set(key, str(index))
            with client(replica) as r:
                r.execute_command("READONLY")  # reads of its master's slots at the replica
                has = functools.partial(_holds, r, key, str(index).encode())
                wait_until(has, 10, f"node {index} has its master's write")
    finally:
        await cluster.stop_async()
    assert not any(node.running for node in cluster.nodes)
