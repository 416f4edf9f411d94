import uuid

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from base.connect import connect_redis
from router.kv.keys import KvKeys
from router.kv.redis_index import RedisPrefixIndex
from router.kv.routing import CandidateLoad, RouteCall
from router.kv.shape import UNKNOWN
from schemas.hashing import block_hashes
from tests.kv_contract import BS, Feeder, IndexContract, M, tokens

pytestmark = pytest.mark.integration


class TestRedisIndex(IndexContract):
    @pytest.fixture(params=["lean", "redis-py"])
    async def index(self, redis_url, request):
        r = await connect_redis(redis_url)
        keys = KvKeys(f"jf:t{uuid.uuid4().hex[:8]}")
        yield RedisPrefixIndex(r, keys, lean=request.param == "lean")
        await r.aclose()


@pytest.fixture
async def index(redis_url):
    r = await connect_redis(redis_url)
    yield RedisPrefixIndex(r, KvKeys(f"jf:t{uuid.uuid4().hex[:8]}"))
    await r.aclose()


async def test_scripts_are_loaded_again_after_a_flush(index):
    f = Feeder(index)
    await f.store("a", tokens(8))
    await index.redis.script_flush()
    await f.store("b", tokens(8))  # apply_many
    h = tuple(block_hashes(tokens(8), BS))
    await index.redis.script_flush()
    out = await index.route(RouteCall(M, "r", h, 2, (CandidateLoad("a"), CandidateLoad("b"))))
    assert out.overlaps == (2, 2)
    await index.redis.script_flush()
    assert await index.release("r")


async def test_a_killed_connection_fails_the_call_and_the_next_one_reconnects(index):
    f = Feeder(index)
    await f.store("a", tokens(8))
    h = block_hashes(tokens(8), BS)
    assert await index.match(M, h) == {"a": 2}
    await index.redis.client_kill_filter(_type="normal", skipme=True)
    try:
        result = await index.match(M, h)
    except RedisConnectionError:  # the call raced the close
        result = await index.match(M, h)
    assert result == {"a": 2}


async def test_a_restored_snapshot_has_no_known_shape(index, redis_url):
    f = Feeder(index)
    await f.store("a", tokens(16))
    snap = await index.export_snapshot()
    r = await connect_redis(redis_url)
    fresh = RedisPrefixIndex(r, KvKeys(f"jf:t{uuid.uuid4().hex[:8]}"))
    await fresh.import_snapshot(snap)
    h = block_hashes(tokens(16), BS)
    assert await fresh.match(M, h) == {"a": 4}
    blocks = await fresh.worker_blocks(M, "a")
    assert blocks.mapping == dict(zip(h, h, strict=True))
    assert set(blocks.parents.values()) == {UNKNOWN}
    assert await index.worker_blocks(M, "a") == type(blocks)(
        blocks.mapping, dict(zip(h, (None, *h[:-1]), strict=True))
    )
    await r.aclose()
