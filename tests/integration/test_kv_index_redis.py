import asyncio
import uuid

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from base.connect import connect_redis
from router.kv import snapshot
from router.kv.redis_index import RedisPrefixIndex
from schemas.hashing import block_hashes
from schemas.kv_events import BlocksSnapshot
from tests.support.kv_contract import BS, Feeder, IndexContract, M, call, pool, tokens
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


class TestRedisIndex(IndexContract):
    """One Redis, the index in one shard or in three (every shard on that server: the same
    scripts and keys as on a cluster, see ``test_kv_index_cluster``)."""

    @pytest.fixture(params=["lean-1", "redis-py-1", "lean-3"])
    async def index(self, redis_url, request):
        r = await connect_redis(redis_url)
        kind, shards = request.param.rsplit("-", 1)
        ns = f"jf:t{uuid.uuid4().hex[:8]}"
        yield RedisPrefixIndex(r, ns, int(shards), lean=kind == "lean", writer=True)
        await r.aclose()


@pytest.fixture
async def index(redis_url):
    r = await connect_redis(redis_url)
    yield RedisPrefixIndex(r, f"jf:t{uuid.uuid4().hex[:8]}", writer=True)
    await r.aclose()


async def test_scripts_are_loaded_again_after_a_flush(index):
    f = Feeder(index)
    await f.store("a", tokens(8))
    await index.redis.script_flush()
    await f.store("b", tokens(8))  # apply (EVAL) and the slot scripts
    h = tuple(block_hashes(tokens(8), BS))
    await index.redis.script_flush()
    out = await index.route(call("r", h, 2, pool("a", "b")))
    assert (out.overlap("a"), out.overlap("b")) == (2, 2)
    await index.redis.script_flush()
    assert await index.release("r")


async def test_a_killed_connection_fails_the_call_and_the_next_one_reconnects(index, redis_url):
    """The lean pipe (``resp.py``): a call in flight when its connection dies raises redis-py's
    ConnectionError (the routers fall back on it); the next call connects again."""
    f = Feeder(index)
    await f.store("a", tokens(8))
    h = block_hashes(tokens(8), BS)
    assert await index.match(M, h) == {"a": 2}
    pipe = index.shards[0].pipe
    assert pipe is not None
    victim = await pipe.call("CLIENT", "ID")
    blocked = asyncio.create_task(pipe.call("BLPOP", f"jf:nothing-{uuid.uuid4().hex}", 30))
    killer = await connect_redis(redis_url)
    try:

        async def waiting() -> bool:
            clients = (await killer.execute_command("CLIENT", "LIST")).decode()
            return f"id={victim} " in clients and "cmd=blpop" in clients

        await wait_for(waiting, timeout=5)
        assert await killer.client_kill_filter(_id=str(victim)) == 1
    finally:
        await killer.aclose()
    with pytest.raises(RedisConnectionError):
        await blocked
    assert await index.match(M, h) == {"a": 2}
    assert await pipe.call("CLIENT", "ID") != victim  # on a new connection


async def test_a_snapshot_read_beside_writes_restores_the_index(index, redis_url):
    """``snapshot.export`` reads in bounded steps while the index changes; restored into a new
    namespace and replayed from its positions, it equals the live index."""
    f = Feeder(index)
    for i, w in enumerate(("a", "b", "c")):
        await f.store(w, tokens(16 + 4 * i))
    parts: dict[str, BlocksSnapshot] = {}

    async def put(name: str, part: BlocksSnapshot) -> None:
        parts[name] = part
        await f.store("d", tokens(8, 300))  # the index moves while it is read

    snap = await snapshot.export(index, put, "t")
    assert snap.positions[0]["0"] >= 3
    r = await connect_redis(redis_url)
    fresh = RedisPrefixIndex(r, f"jf:t{uuid.uuid4().hex[:8]}", writer=True)

    async def get(name: str) -> BlocksSnapshot:
        return parts[name]

    await snapshot.restore(fresh, snap, get)
    assert await fresh.applied_seq() == snap.positions[0]["0"]
    live = await index.dump()
    restored = await fresh.dump()
    assert restored[M].keys() <= live[M].keys()
    assert all(restored[M][h] <= live[M][h] for h in restored[M])
    await r.aclose()


async def test_a_redis_that_stops_answering_times_out_pipelined_applies(index, redis_url):
    """The indexer's pipelined applies (``start_apply``, read later) and ``call_many`` wait for
    their replies no longer than the call timeout, as a single call does: a host gone without a
    reset would otherwise stall the indexer for good. The next call connects again."""
    f = Feeder(index)
    await f.store("a", tokens(8))
    pipe = index.shards[0].pipe
    assert pipe is not None
    pipe.call_timeout_s = 0.3
    first = await pipe.call("CLIENT", "ID")
    pauser = await connect_redis(redis_url)
    try:
        await pauser.execute_command("CLIENT", "PAUSE", 1500, "ALL")  # replies stop coming
        with pytest.raises(RedisTimeoutError):
            await f.store("b", tokens(16))
        with pytest.raises(RedisTimeoutError):
            await pipe.call_many([("PING",), ("PING",)])

        async def answers() -> bool:
            try:
                return await pipe.call_many([("PING",)]) == [b"PONG"]
            except RedisTimeoutError:
                return False

        await wait_for(answers, timeout=10)
    finally:
        await pauser.aclose()
    assert await pipe.call("CLIENT", "ID") != first  # the stuck connection was dropped
    await f.store("c", tokens(12))
    assert "c" in await index.match(M, block_hashes(tokens(12), BS))
