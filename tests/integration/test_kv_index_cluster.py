"""The prefix index on a real 3-master Redis Cluster: the index contract, the random-stream
equivalence with the in-memory index, and the routes spread over the shards' nodes.

Each shard's keys share a hash tag chosen in one master's slots (``router/kv/shard_clients.py``):
a script that touched keys of two shards would fail with CROSSSLOT, one sent to the wrong node
with MOVED, so a passing suite shows every call touches one slot of the node it is sent to.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter

import pytest

from base.connect import connect_redis
from base.redis_slots import key_slot, slot_range
from router.kv.index import InMemoryPrefixIndex
from router.kv.redis_index import RedisPrefixIndex
from router.kv.routing import RouteCall, WorkerPool
from router.kv.shards import route_shard
from router.kv.translate import ops_of
from schemas.hashing import block_hashes
from tests.integration.test_kv_index_equivalence import World, compare
from tests.support.kv_contract import IndexContract

pytestmark = pytest.mark.integration


@pytest.fixture
async def cluster_index(redis_cluster):
    r = await connect_redis(redis_cluster.url)
    index = RedisPrefixIndex(r, f"jf:c{uuid.uuid4().hex[:8]}", writer=True)
    yield index
    await index.aclose()
    await r.aclose()


class TestClusterIndex(IndexContract):
    @pytest.fixture
    async def index(self, cluster_index):
        return cluster_index


async def test_each_shard_lives_on_its_own_master(cluster_index):
    shards = await cluster_index.ready()
    assert shards.cluster and shards.n == 3
    ports = {s.redis.connection_pool.connection_kwargs["port"] for s in shards.shards}
    assert len(ports) == 3
    for s in shards.shards:
        lo, hi = slot_range(s.index, 3)
        assert lo <= key_slot(s.keys.blocks("m")) < hi


@pytest.mark.parametrize("seed", range(2))
async def test_random_streams_on_a_cluster_match_the_in_memory_index(cluster_index, seed):
    rng = random.Random(seed)
    world = World(rng, workers=8)
    mem = InMemoryPrefixIndex()
    for seq in range(1, 301):
        b = world.step()
        ops = ops_of(b)
        await mem.apply("m", b.worker_id, b.event_id, seq, ops)
        await cluster_index.apply_many([("m", b.worker_id, b.event_id, seq, ops)])
        if seq % 100 == 0:
            await compare(world, mem, cluster_index)
    assert await cluster_index.dump() == mem.dump()


async def test_routes_of_different_branches_spread_over_the_nodes(cluster_index):
    rng = random.Random(3)
    pool = WorkerPool(("a", "b"))
    used = Counter()
    for i in range(60):
        prompt = [rng.randrange(1000) for _ in range(64)]
        h = tuple(block_hashes(prompt, 4))
        used[route_shard(h, 3)] += 1
        out = await cluster_index.route(RouteCall("m", f"r{i}", h, 16, pool, pool.workers))
        assert out.winner in ("a", "b")
        assert await cluster_index.release(f"r{i}")
    assert set(used) == {0, 1, 2} and min(used.values()) >= 10
