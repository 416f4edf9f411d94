"""KV-aware routing end to end: mocker KV events -> JetStream -> indexer -> Redis -> frontend."""

from __future__ import annotations

import httpx
import pytest

from infra.jetstream import connect_redis
from router.kv.keys import KvKeys
from router.kv.redis_index import RedisPrefixIndex
from router.kv.translate import fleet_hashes_for_prompt
from tests.e2e.fleet import Fleet
from tests.e2e.test_fleet_lifecycle import Observations
from tests.helpers import wait_for

pytestmark = pytest.mark.integration

M = "jetfleet-tiny"
PREFIX = "a long shared system prompt about routing, " * 16  # 688 bytes = 43 blocks


@pytest.fixture(scope="module")
def kv_fleet(nats_server, redis_server, tmp_path_factory):
    f = Fleet(nats_server.url, tmp_path_factory.mktemp("kv-fleet"), redis_url=redis_server.url)
    f.add_worker()
    f.add_worker()
    f.start_indexer()
    f.start_frontend("--router", "kv")
    yield f
    f.stop()


async def test_repeated_prefix_goes_to_the_worker_that_cached_it(kv_fleet):
    redis = await connect_redis(kv_fleet.redis_url)
    index = RedisPrefixIndex(redis, KvKeys.for_prefix(kv_fleet.prefix))
    hashes = fleet_hashes_for_prompt(list(PREFIX.encode()), 16)
    try:
        async with Observations(kv_fleet) as obs, httpx.AsyncClient(timeout=30) as client:
            url = f"{kv_fleet.base_url}/v1/completions"
            r = await client.post(url, json={"model": M, "prompt": PREFIX + "one", "max_tokens": 4})
            assert r.status_code == 200, r.text
            await wait_for(lambda: len(obs.items) == 1, timeout=10)
            first = obs.items[0].worker_id

            async def indexed() -> bool:
                return (await index.match(M, hashes)).get(first, 0) == len(hashes)

            await wait_for(indexed, timeout=10)
            for suffix in ("two", "three", "four"):
                r = await client.post(
                    url, json={"model": M, "prompt": PREFIX + suffix, "max_tokens": 4}
                )
                assert r.status_code == 200
                assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 42 * 16
            await wait_for(lambda: len(obs.items) == 4, timeout=10)
        for o in obs.items[1:]:
            assert o.worker_id == first and o.route is not None and o.route.policy == "kv"
            won = next(c for c in o.route.candidates if c.worker_id == first)
            assert won.overlap_blocks == len(hashes)
            assert o.cached_tokens >= 42 * 16
    finally:
        await redis.aclose()


async def test_departed_worker_blocks_are_dropped(kv_fleet):
    redis = await connect_redis(kv_fleet.redis_url)
    index = RedisPrefixIndex(redis, KvKeys.for_prefix(kv_fleet.prefix))
    try:
        extra = kv_fleet.add_worker()
        # fresh prompts (a repeated one would stick to whoever cached it first) until the
        # router has sent one to the new worker and its KV events are indexed
        attempt = iter(range(1000))
        async with httpx.AsyncClient(timeout=30) as client:

            async def holds() -> bool:
                prompt = f"private prompt number {next(attempt)} for the newcomer " * 8
                await client.post(
                    f"{kv_fleet.base_url}/v1/completions",
                    json={"model": M, "prompt": prompt, "max_tokens": 2},
                )
                return extra in await index.workers(M)

            await wait_for(holds, timeout=20, interval=0.1)
        kv_fleet.kill(extra)

        async def dropped() -> bool:
            return extra not in await index.workers(M)

        await wait_for(dropped, timeout=15)
    finally:
        await redis.aclose()
