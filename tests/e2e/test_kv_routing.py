"""KV-aware routing end to end: mocker KV events -> JetStream -> indexer -> Redis -> frontend."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from base.connect import connect_redis
from router.kv.keys import namespace
from router.kv.redis_index import RedisPrefixIndex
from router.kv.translate import fleet_hashes_for_prompt
from tests.e2e.test_fleet_lifecycle import Observations
from tests.support.clients import run_cli
from tests.support.fleet import Fleet, kv_fleet
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

M = "jetfleet-tiny"
PREFIX = "a long shared system prompt about routing, " * 16  # 688 bytes = 43 blocks


@pytest.fixture(scope="module", name="kv_fleet")
def kv_fleet_fixture(nats_server, redis_server, tmp_path_factory) -> Iterator[Fleet]:
    logs = tmp_path_factory.mktemp("kv-fleet")
    with kv_fleet(nats_server.url, logs, redis_server.url, workers=2) as f:
        yield f


async def test_repeated_prefix_goes_to_the_worker_that_cached_it(kv_fleet):
    redis = await connect_redis(kv_fleet.redis_url)
    index = RedisPrefixIndex(redis, namespace(kv_fleet.prefix))
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
    index = RedisPrefixIndex(redis, namespace(kv_fleet.prefix))
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


async def test_replay_kv_explains_why_a_request_went_where_it_went(kv_fleet):
    t0 = time.time() - 1
    prompt = "explain my route, please: " * 20  # 520 bytes = 32 full blocks
    async with Observations(kv_fleet) as obs, httpx.AsyncClient(timeout=30) as client:
        url = f"{kv_fleet.base_url}/v1/completions"
        ids = []
        for suffix in ("a", "b"):
            r = await client.post(
                url, json={"model": M, "prompt": prompt + suffix, "max_tokens": 2}
            )
            assert r.status_code == 200, r.text
            ids.append(r.json()["id"])
            await wait_for(lambda n=len(ids): len(obs.items) == n, timeout=10)
            if suffix == "a":  # let the first one's blocks reach the index
                await wait_for(
                    lambda: _indexed(kv_fleet, obs.items[0].worker_id, prompt), timeout=10
                )
    # As an operator asks it: the CLI, JSON out.
    done = await run_cli(
        "replay", "kv", "--nats", kv_fleet.nats_url, "--subject-prefix", kv_fleet.prefix,
        "--request", ids[1], "--from", str(t0), "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)["request"]
    second = obs.items[1]
    assert report["routed_to"] == second.worker_id == obs.items[0].worker_id
    assert report["prompt_blocks"] == 32
    assert report["replayed_overlap"].get(second.worker_id) == 32
    assert report["recorded"][second.worker_id]["overlap"] == 32  # what the router saw then
    for prefix, said in ((kv_fleet.prefix, "no-such-id"), ("nofleet", "no fleet under")):
        missing = await run_cli(
            "replay", "kv", "--nats", kv_fleet.nats_url, "--subject-prefix", prefix,
            "--request", "no-such-id",
        )  # fmt: skip
        assert missing.returncode == 1 and said in missing.stderr, missing.stderr
        assert "Traceback" not in missing.stderr


async def _indexed(fleet, worker_id: str, prompt: str) -> bool:
    redis = await connect_redis(fleet.redis_url)
    try:
        index = RedisPrefixIndex(redis, namespace(fleet.prefix))
        hashes = fleet_hashes_for_prompt(list(prompt.encode()), 16)
        return (await index.match(M, hashes)).get(worker_id, 0) == len(hashes)
    finally:
        await redis.aclose()


async def test_kv_resync_republishes_a_workers_cache(kv_fleet):
    from base.connect import close_nats, connect_nats
    from schemas import ControlReply, ControlRequest, KvEventBatch, Subjects, decode, encode
    from schemas.kv_events import BlockStored

    async with Observations(kv_fleet) as obs, httpx.AsyncClient(timeout=30) as client:
        prompt = "resync me: " * 40  # 440 bytes = 27 full blocks
        r = await client.post(
            f"{kv_fleet.base_url}/v1/completions",
            json={"model": M, "prompt": prompt, "max_tokens": 2},
        )
        assert r.status_code == 200, r.text
        await wait_for(lambda: obs.items, timeout=10)
    worker = obs.items[0].worker_id
    s = Subjects(kv_fleet.prefix)
    nc = await connect_nats(kv_fleet.nats_url, name="test-resync")
    try:
        batches: list[KvEventBatch] = []

        async def on(msg) -> None:
            batches.append(decode(msg.data, KvEventBatch))

        await nc.subscribe(s.kv(M, worker), cb=on)
        reply = decode(
            (await nc.request(s.ctl(worker, "kv_resync"), encode(ControlRequest()), 5)).data,
            ControlReply,
        )
        assert reply.ok, reply.detail
        await wait_for(lambda: batches, timeout=5)
    finally:
        await close_nats(nc)
    stored = {
        h for b in batches for e in b.events if isinstance(e, BlockStored) for h in e.block_hashes
    }
    assert set(fleet_hashes_for_prompt(list(prompt.encode()), 16)[:27]) <= stored
