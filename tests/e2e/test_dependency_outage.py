"""Redis goes away under a kv frontend. By default routing goes on by load (policy
``kv-fallback``) and the frontend stays ready; with ``--no-kv-redis-fallback`` the requests get
clear 503s and the frontend says it is not ready. Either way it recovers on its own."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from infra.embedded import EmbeddedRedis
from tests.e2e.test_fleet_lifecycle import Observations
from tests.support.fleet import Fleet, kv_fleet
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

M = "jetfleet-tiny"
BODY = {"model": M, "prompt": "hello", "max_tokens": 2}


@contextlib.contextmanager
def own_redis_kv_fleet(
    nats_url: str, tmp: Path, *frontend_args: str
) -> Iterator[tuple[Fleet, EmbeddedRedis]]:
    """One worker, an indexer and a kv frontend on a Redis of their own (the test stops and
    starts it on the same port)."""
    redis = EmbeddedRedis(tmp / "redis", port=0)
    redis.start()
    try:
        with kv_fleet(nats_url, tmp / "logs", redis.url, *frontend_args) as f:
            yield f, redis
    finally:
        redis.stop()


async def test_redis_outage_routes_by_load_then_by_cache_again(nats_server, tmp_path):
    with own_redis_kv_fleet(nats_server.url, tmp_path) as (f, redis):
        url = f"{f.base_url}/v1/completions"
        async with Observations(f) as obs, httpx.AsyncClient(timeout=30) as client:
            assert (await client.post(url, json=BODY)).status_code == 200
            redis.stop()
            for _ in range(3):
                r = await client.post(url, json=BODY)
                assert r.status_code == 200, r.text
            assert (await client.get(f"{f.base_url}/ready")).status_code == 200
            await wait_for(lambda: len(obs.items) >= 4, timeout=10)
            policies = [o.route.policy for o in obs.items if o.route is not None]
            assert policies[0] == "kv" and policies[1:4] == ["kv-fallback"] * 3, policies
            redis.start()  # same port

            async def by_cache() -> bool:
                r = await client.post(url, json=BODY)
                return r.status_code == 200 and obs.items[-1].route.policy == "kv"

            await wait_for(by_cache, timeout=20, interval=0.5)


async def test_without_the_fallback_an_outage_gives_503_then_recovers(nats_server, tmp_path):
    with own_redis_kv_fleet(nats_server.url, tmp_path, "--no-kv-redis-fallback") as (f, redis):
        url = f"{f.base_url}/v1/completions"
        async with httpx.AsyncClient(timeout=30) as client:
            assert (await client.post(url, json=BODY)).status_code == 200
            redis.stop()
            r = await client.post(url, json=BODY)
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "routing_unavailable"
            ready = await client.get(f"{f.base_url}/ready")
            assert ready.status_code == 503
            assert any("redis" in reason for reason in ready.json()["reasons"])
            redis.start()  # same port

            async def serves() -> bool:
                return (await client.post(url, json=BODY)).status_code == 200

            await wait_for(serves, timeout=20, interval=0.5)
            assert (await client.get(f"{f.base_url}/ready")).status_code == 200
