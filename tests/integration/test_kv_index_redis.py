import uuid

import pytest

from infra.jetstream import connect_redis
from router.kv.keys import KvKeys
from router.kv.redis_index import RedisPrefixIndex
from tests.kv_contract import IndexContract

pytestmark = pytest.mark.integration


class TestRedisIndex(IndexContract):
    @pytest.fixture
    async def index(self, redis_url):
        r = await connect_redis(redis_url)
        yield RedisPrefixIndex(r, KvKeys(f"jf:t{uuid.uuid4().hex[:8]}"))
        await r.aclose()
