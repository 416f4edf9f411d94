"""The fleet on Redis with a replica and Sentinel (``redis+sentinel://``): a primary, a replica
and three sentinels on loopback. Both clients (redis-py's and the routing hot path's lean pipe)
find the primary through the sentinels, and find the new one after a failover."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import pytest

from base.connect import connect_nats, connect_redis, parse_sentinel_url
from router.kv.keys import namespace
from router.kv.redis_index import RedisPrefixIndex
from router.kv.resp import RespPipe
from tests.support.redis_ha import SERVICE, RedisHA
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def ha(tmp_path) -> Iterator[RedisHA]:
    h = RedisHA(tmp_path / "ha")
    h.start()
    try:
        yield h
    finally:
        h.stop()


def test_sentinel_urls_parse() -> None:
    got = parse_sentinel_url("redis+sentinel://:pw@a:1,b:2/svc/3")
    assert got.sentinels == [("a", 1), ("b", 2)] and got.service == "svc"
    assert (got.db, got.username, got.password) == (3, None, "pw")
    assert parse_sentinel_url("redis+sentinel://a/svc").sentinels == [("a", 26379)]
    for bad in ("redis+sentinel://a:1", "redis+sentinel:///svc", "redis+sentinel://a:x/s"):
        with pytest.raises(ValueError, match="redis\\+sentinel"):
            parse_sentinel_url(bad)


async def test_both_clients_follow_the_primary_through_a_failover(ha: RedisHA) -> None:
    redis = await connect_redis(ha.url)
    pipe = RespPipe.for_client(redis)
    assert pipe is not None  # the lean pipe serves Sentinel clients too
    try:
        await redis.set("k", "before")
        assert await pipe.call("GET", "k") == b"before"
        old = ha.kill_primary()
        t0 = time.monotonic()

        async def promoted() -> int | None:
            port = ha.primary()
            return port if port not in (None, old) else None

        new = await wait_for(promoted, timeout=30)
        promotion_s = time.monotonic() - t0
        assert new != old and promotion_s < 15

        async def both_write() -> bool:
            try:
                await redis.set("k", "after")
                return await pipe.call("GET", "k") == b"after"
            except Exception:
                return False

        await wait_for(both_write, timeout=15)
        info = await redis.info("server")
        assert int(info["tcp_port"]) == new
    finally:
        pipe.close()
        await redis.aclose()


def test_service_name_is_the_urls(ha: RedisHA) -> None:
    assert parse_sentinel_url(ha.url).service == SERVICE
    assert asyncio.run(_ping(ha.url))


async def _ping(url: str) -> bool:
    r = await connect_redis(url)
    try:
        return bool(await r.ping())
    finally:
        await r.aclose()


async def test_routing_goes_on_through_a_failover_and_the_index_is_whole_after(
    ha: RedisHA, tmp_path
) -> None:
    """``jetfleet up --redis redis+sentinel://...``: kv routing under load (c=8); the primary is
    killed. Every request is answered in full; after the promotion the indexer writes to the new
    primary and a repeated prefix is found there again."""
    import httpx

    from tests.support.up import running_up

    statuses: list[int] = []
    with running_up(tmp_path, 2, "--redis", ha.url, "--speedup", "20") as up:
        url = f"{up.base_url}/v1/completions"
        stop = asyncio.Event()

        async def client_loop(i: int, http: httpx.AsyncClient) -> None:
            n = 0
            while not stop.is_set():
                prompt = f"conversation {i % 4}: " + "the same long prefix " * 40 + str(n)
                body = {"model": "jetfleet-tiny", "prompt": prompt, "max_tokens": 8}
                r = await http.post(url, json=body)
                statuses.append(r.status_code)
                if r.status_code == 200:
                    assert r.json()["usage"]["completion_tokens"] == 8
                n += 1

        async with httpx.AsyncClient(timeout=60) as http:
            loops = [asyncio.create_task(client_loop(i, http)) for i in range(8)]
            await wait_for(lambda: len(statuses) >= 50, timeout=30)
            old = ha.kill_primary()
            killed_at = time.monotonic()
            new = await wait_for(lambda: (p := ha.primary()) not in (None, old) and p, timeout=30)
            promotion_s = time.monotonic() - killed_at
            during = len(statuses)
            await wait_for(lambda: len(statuses) >= during + 100, timeout=60)
            stop.set()
            await asyncio.gather(*loops)

            # the index lives on the new primary: a prompt served twice is found cached there
            prompt = "after the failover " * 60
            body = {"model": "jetfleet-tiny", "prompt": prompt, "max_tokens": 1}

            async def cached() -> bool:
                r = await http.post(url, json=body)
                return (
                    r.status_code == 200
                    and r.json()["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
                    > 0
                )

            await wait_for(cached, timeout=20)
        # whole: the indexer (never restarted by up) applied the whole stream on the new primary
        assert up.log.read_text().count('"name": "indexer"') == 1, "the indexer was restarted"
        nc = await connect_nats(up.nats_url, name="test-kv-tail")
        redis = await connect_redis(ha.url)
        try:
            stream = up.subjects.stream_name("KV")
            tail = (await nc.jetstream().stream_info(stream)).state.last_seq
            index = RedisPrefixIndex(redis, namespace(up.subjects.prefix))

            async def caught_up() -> bool:
                return await index.applied_seq() >= tail

            await wait_for(caught_up, timeout=30)
        finally:
            await redis.aclose()
            await nc.close()
    errors = [s for s in statuses if s != 200]
    print(
        f"\nsentinel failover under jetfleet up: primary {old} -> {new} promoted in "
        f"{promotion_s:.2f}s; {len(statuses)} requests, {len(errors)} not 200 "
        f"{sorted(set(errors))}"
    )
    assert not errors, f"{len(errors)} of {len(statuses)} requests failed: {set(errors)}"


async def test_a_demoted_primary_is_left_for_the_new_one(ha: RedisHA) -> None:
    """A manual failover keeps the old primary running, as a replica: the lean pipe's next
    write there fails as unreachable at most once (the kv router falls back for that call), and
    the calls after it locate the new primary and succeed."""
    import redis as sync_redis
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import ResponseError

    client = await connect_redis(ha.url)
    pipe = RespPipe.for_client(client)
    assert pipe is not None
    try:
        await pipe.call("SET", "k", "1")
        old = ha.primary()

        def failover() -> bool:
            """Asked until the sentinel knows a replica good to promote (just after start it
            may not have seen the replica's link up yet: NOGOODSLAVE)."""
            with sync_redis.Redis(port=ha.sentinel_ports[0]) as s:
                try:
                    s.execute_command("SENTINEL", "FAILOVER", SERVICE)
                except ResponseError as exc:
                    if "NOGOODSLAVE" not in str(exc):
                        raise
                    return False
            return True

        await wait_for(failover, timeout=30, interval=0.2)
        await wait_for(lambda: ha.primary() not in (None, old), timeout=30)
        # the old primary is a replica now (still up), and the pipe is still connected to it

        async def demoted() -> bool:
            with sync_redis.Redis(port=old) as r:
                return r.info("replication")["role"] == "slave"

        await wait_for(demoted, timeout=30)
        # Sentinel also kills the demoted server's clients: the pipe either sees that (lost)
        # or, still connected, a READONLY refusal; either is "unreachable" for this one call
        with contextlib.suppress(RedisConnectionError):
            await pipe.call("SET", "k", "2")
        await pipe.call("SET", "k", "3")
        assert await pipe.call("GET", "k") == b"3"
        assert pipe.port == ha.primary()
    finally:
        pipe.close()
        await client.aclose()


async def test_a_replica_refuses_writes_as_unreachable_and_loading_maps_too(ha: RedisHA) -> None:
    from redis.exceptions import BusyLoadingError
    from redis.exceptions import ConnectionError as RedisConnectionError

    replica = next(p for p in ha.data_ports if p != ha.primary())
    pipe = RespPipe(port=replica)
    try:
        with pytest.raises(RedisConnectionError, match="READONLY"):
            await pipe.call("SET", "k", "x")
        assert await pipe.call("PING") in (b"PONG", "PONG")  # connected again at once
    finally:
        pipe.close()
    assert issubclass(BusyLoadingError, RedisConnectionError)  # LOADING is unreachability too
