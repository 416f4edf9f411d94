"""A host-memory KV tier end to end: mocker (--num-cpu-blocks) -> tiered KV events -> JetStream
-> indexer -> Redis (the worker's host tier as its own holder) -> the kv router, which sends a
prompt to the worker holding its prefix in host memory; the prompt is loaded back, not
recomputed, and the response and the observation say so."""

from __future__ import annotations

import httpx
import pytest

from base.connect import connect_nats, connect_redis
from infra.tools import fleet_status
from router.kv.keys import namespace
from router.kv.redis_index import RedisPrefixIndex
from router.kv.translate import fleet_hashes_for_prompt, tier_holder
from schemas import Subjects
from tests.e2e.test_fleet_lifecycle import Observations
from tests.support.fleet import Fleet
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

M = "jetfleet-tiny"
HEAD = "a long shared system prompt about host memory tiers, " * 13  # 689 bytes: 43 blocks
# 64 GPU blocks of 16 tokens: two other prompts of this size push the head out of the GPU
OTHERS = [f"unrelated prompt {i} that fills the cache " * 17 for i in range(3)]


async def test_a_prefix_in_host_memory_is_routed_to_and_loaded_back(
    nats_server, redis_server, tmp_path
) -> None:
    tiered = ("--num-gpu-blocks", "64", "--num-cpu-blocks", "512")
    fleet = Fleet(nats_server.url, tmp_path, redis_url=redis_server.url)
    redis = await connect_redis(redis_server.url)
    index = RedisPrefixIndex(redis, namespace(fleet.prefix))
    hashes = fleet_hashes_for_prompt(list(HEAD.encode()), 16)
    try:
        first = fleet.add_worker(*tiered)
        fleet.start_indexer()
        # no routing hints: the router's memory of sending the head here would count it whole
        fleet.start_frontend("--router", "kv", "--kv-hint-ttl", "0")
        url = f"{fleet.base_url}/v1/completions"
        async with Observations(fleet) as obs, httpx.AsyncClient(timeout=30) as client:

            async def complete(prompt: str) -> dict:
                r = await client.post(url, json={"model": M, "prompt": prompt, "max_tokens": 2})
                assert r.status_code == 200, r.text
                return r.json()

            await complete(HEAD + "one")
            for other in OTHERS:  # the head leaves the GPU for the host tier
                await complete(other)

            async def in_host_only() -> bool:
                held = await index.match(M, hashes)
                return held.get(tier_holder(first, "CPU"), 0) == len(hashes) and not held.get(first)

            await wait_for(in_host_only, timeout=20)
            # a second worker with nothing cached: the head is cheaper where its host copy is
            fleet.add_worker(*tiered)
            await wait_for(lambda: len(obs.items) == 4, timeout=10)

            async def two_candidates() -> bool:
                await client.post(url, json={"model": M, "prompt": "x", "max_tokens": 1})
                await wait_for(lambda: len(obs.items) > 4, timeout=10)
                last = obs.items[-1]
                return last.route is not None and len(last.route.candidates) == 2

            await wait_for(two_candidates, timeout=30, interval=0.2)
            body = await complete(HEAD + "two")

            def head_again() -> list:
                return [o for o in obs.items[4:] if o.isl_tokens >= len(HEAD)]

            await wait_for(head_again, timeout=10)
        (o,) = head_again()
        assert o.worker_id == first and o.route is not None
        won = next(c for c in o.route.candidates if c.worker_id == first)
        assert won.overlap_blocks == int(0.75 * len(hashes))  # host blocks at 0.75 of a hit
        # every full block of the head came back from host memory, none recomputed
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(hashes) * 16
        assert o.host_cached_tokens == o.cached_tokens >= len(hashes) * 16

        # jetfleet status: the host tier's size and how full it is
        nc = await connect_nats(fleet.nats_url, name="test-status")
        try:

            async def host_row() -> dict | None:
                report = await fleet_status(nc, Subjects(fleet.prefix))
                row = next(w for w in report["workers"] if w["worker_id"] == first)
                return row if row.get("host_kv_usage") else None

            row = await wait_for(host_row, timeout=10)
        finally:
            await nc.close()
        assert row["num_cpu_blocks"] == 512 and 40 / 512 <= row["host_kv_usage"] <= 1
    finally:
        await redis.aclose()
        fleet.stop()
