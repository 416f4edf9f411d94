"""KV routers over a real Redis, one server and a 3-master Redis Cluster: two frontends share
reservations; choices follow the cache; a large fleet is sampled."""

from __future__ import annotations

import uuid

import pytest

from base.connect import connect_redis
from router.fleet_state import FleetState
from router.kv.redis_index import RedisPrefixIndex
from router.kv.router import OBSERVED_CANDIDATES, ApproxKvRouter, KvRouter, KvRouterConfig
from router.kv.translate import StoreOp, fleet_hashes_for_prompt
from router.policies import RouteQuery
from tests.support.builders import fleet_state, registration

pytestmark = pytest.mark.integration


def fleet(*workers: str) -> FleetState:
    return fleet_state(*(registration(w, num_gpu_blocks=1000) for w in workers))


@pytest.fixture(params=["single", "cluster"])
def index_url(request: pytest.FixtureRequest) -> str:
    """Every router test on one redis-server and on a 3-master Redis Cluster."""
    if request.param == "single":
        return str(request.getfixturevalue("redis_url"))
    return str(request.getfixturevalue("redis_cluster").url)


@pytest.fixture
async def two_frontends(index_url):
    ns = f"jf:t{uuid.uuid4().hex[:8]}"
    a, b = await connect_redis(index_url), await connect_redis(index_url)
    yield KvRouter(RedisPrefixIndex(a, ns), seed=1), KvRouter(RedisPrefixIndex(b, ns), seed=2)
    await a.aclose()
    await b.aclose()


async def test_frontends_see_each_others_reservations(two_frontends):
    ra, rb = two_frontends
    st = fleet("w1", "w2")
    prompt = tuple(range(160))  # 10 blocks
    d1 = await ra.route(RouteQuery("m", prompt, "req-1"), st.candidates("m"))
    # frontend B routes the same prompt: A's reservation weighs on the worker A chose
    d2 = await rb.route(RouteQuery("m", prompt, "req-2"), st.candidates("m"))
    assert d2.worker_id != d1.worker_id
    loads = {c.worker_id: c.load for c in d2.candidates}
    ovh = ra.cfg.prefill_overhead_blocks
    assert loads[d1.worker_id] == 20.0 + ovh  # 10 prefill (+ overhead) + 10 decode blocks, by A
    await ra.finished("req-1")
    d3 = await rb.route(RouteQuery("m", prompt, "req-3"), st.candidates("m"))
    assert {c.worker_id: c.load for c in d3.candidates}[d1.worker_id] == 0.0
    await rb.finished("req-2")
    await rb.finished("req-3")


async def test_kv_router_follows_the_cached_prefix(two_frontends):
    ra, _ = two_frontends
    st = fleet("w1", "w2", "w3")
    prompt = tuple(range(320))
    hashes = tuple(fleet_hashes_for_prompt(prompt, 16))
    await ra.index.apply("m", "w3", 1, 0, [StoreOp("w3", hashes)])
    d = await ra.route(RouteQuery("m", (*prompt, 7, 8, 9), "req-x"), st.candidates("m"))
    assert d.worker_id == "w3" and d.policy == "kv"
    assert {c.worker_id: c.overlap_blocks for c in d.candidates} == {"w1": 0, "w2": 0, "w3": 20}
    await ra.first_token("req-x")
    assert await ra.index.reserved("m", "w3") == (0, 21)
    await ra.finished("req-x")
    assert await ra.index.reserved("m", "w3") == (0, 0)


async def test_approx_router_keeps_prefix_affinity_without_events():
    router = ApproxKvRouter(seed=0)
    st = fleet("w1", "w2", "w3")
    first = await router.route(RouteQuery("m", tuple(range(256))), st.candidates("m"))
    again = await router.route(RouteQuery("m", (*range(256), 1, 2)), st.candidates("m"))
    assert again.worker_id == first.worker_id
    won = next(c for c in again.candidates if c.worker_id == again.worker_id)
    assert won.overlap_blocks == 16


async def test_a_large_fleet_is_sampled_and_its_holder_still_found(index_url):
    """300 workers: a route scores the sample and the holders of the prompt (not the fleet), the
    one holder of the whole prompt wins although it was not sampled, and the decision keeps the
    best few candidates, whatever the fleet's size."""
    r = await connect_redis(index_url)
    index = RedisPrefixIndex(r, f"jf:t{uuid.uuid4().hex[:8]}", writer=True)
    router = KvRouter(index, KvRouterConfig(sample=8, temperature=0), seed=4)
    workers = [f"w{i:03d}" for i in range(300)]
    st = fleet(*workers)
    prompt = tuple(range(320))
    hashes = tuple(fleet_hashes_for_prompt(prompt, 16))
    for i, w in enumerate(workers):  # everyone holds the first block; w123 holds it all
        held = hashes if w == "w123" else hashes[:1]
        await index.apply("m", w, 1, i + 1, [StoreOp(w, held)])
    await index.load_table("m")
    d = await router.route(RouteQuery("m", (*prompt, 7), "req-big"), st.candidates("m"))
    assert d.worker_id == "w123"
    assert len(d.candidates) == OBSERVED_CANDIDATES
    assert d.candidates[0].worker_id == "w123" and d.candidates[0].overlap_blocks == 20
    await router.finished("req-big")
    assert index.shards.n == (3 if index.shards.cluster else 1)  # one shard per cluster master
    await r.aclose()
