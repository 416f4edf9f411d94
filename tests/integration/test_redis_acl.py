"""The shipped Redis users (infra/deploy/redis-users.acl) on a real redis-server: the indexer and
the routers work under their own users, and each is refused what its role does not need."""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

from base.connect import connect_redis
from base.topology import ensure_topology
from infra.embedded import EmbeddedRedis
from router.indexer import Indexer, IndexerConfig, IndexerMetrics
from router.kv.keys import namespace
from router.kv.redis_index import RedisPrefixIndex
from router.kv.router import KvRouter
from router.kv.translate import StoreOp
from router.policies import RouteQuery
from schemas import encode
from schemas.hashing import block_hashes
from schemas.kv_events import BlockStored
from tests.support.builders import fleet_state, registration
from tests.support.kv_events import kv_batch, mocker_event_batches
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

ACL = Path(__file__).resolve().parents[2] / "infra" / "deploy" / "redis-users.acl"
PASSWORDS = {role: f"pw-{role}-{uuid.uuid4().hex[:8]}" for role in ("indexer", "frontend", "admin")}


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory: pytest.TempPathFactory):
    text = ACL.read_text()
    for role, pw in PASSWORDS.items():  # the shipped file, only the passwords swapped
        text, n = re.subn(rf">CHANGE-ME-{role}\b", f">{pw}", text)
        assert n == 1, role
    tmp = tmp_path_factory.mktemp("redis-acl")
    (tmp / "users.acl").write_text(text)
    server = EmbeddedRedis(tmp, aclfile=tmp / "users.acl", probe_user=("admin", PASSWORDS["admin"]))
    server.start()
    yield server
    server.stop()


def url(server: EmbeddedRedis, role: str) -> str:
    return f"redis://{role}:{PASSWORDS[role]}@{server.host}:{server.port}/0"


async def test_anonymous_and_wrong_passwords_are_refused(acl_redis) -> None:
    anon = await connect_redis(acl_redis.url)
    with pytest.raises((AuthenticationError, ResponseError)):
        await anon.ping()
    await anon.aclose()
    wrong = await connect_redis(url(acl_redis, "frontend").replace(PASSWORDS["frontend"], "x"))
    with pytest.raises(AuthenticationError):
        await wrong.ping()
    await wrong.aclose()


async def test_indexer_and_frontend_under_their_own_users(acl_redis, nc, subjects) -> None:
    """A real indexer applies FLEET_KV events under `indexer`; a kv router routes on them under
    `frontend` (both on the lean connection and through redis-py)."""
    await ensure_topology(nc.jetstream(), subjects)
    redis_ix = await connect_redis(url(acl_redis, "indexer"))
    cfg = IndexerConfig(nc.connected_url.geturl(), url(acl_redis, "indexer"), subjects)
    indexer = Indexer(cfg, nc, redis_ix, IndexerMetrics(CollectorRegistry()))
    stop = asyncio.Event()
    task = asyncio.create_task(indexer.run(stop))
    prompt = tuple(range(40))
    known = kv_batch("wk", 1, BlockStored(tuple(block_hashes(prompt, 4)), None))
    batches = [*mocker_event_batches(requests=20, seed=7), known]
    js = nc.jetstream()
    last = 0
    for b in batches:
        last = (await js.publish(subjects.kv(b.model, b.worker_id), encode(b))).seq
    await wait_for(lambda: indexer.applied >= last, timeout=20)
    assert await indexer.index.applied_seq() == last

    redis_fe = await connect_redis(url(acl_redis, "frontend"))
    for lean in (True, False):
        index = RedisPrefixIndex(redis_fe, namespace(subjects.prefix), lean=lean)
        router = KvRouter(index, seed=1)
        await router.warm()
        state = fleet_state(  # the workers of mocker_event_batches
            *(
                registration(w, max_num_seqs=4, num_gpu_blocks=64, block_size=4)
                for w in ("w0", "w1", "wk")
            )
        )
        rid = f"req-{lean}"
        decision = await router.route(RouteQuery("m", prompt, rid), state.candidates("m"))
        assert max(c.overlap_blocks for c in decision.candidates) > 0
        await router.first_token(rid)
        await router.finished(rid)
        assert await router.index.match("m", known.events[0].block_hashes) == {"wk": 10}
    await redis_fe.ping()  # the frontend's /ready check

    stop.set()
    await asyncio.wait_for(task, 10)
    await redis_ix.aclose()
    await redis_fe.aclose()


async def test_each_role_is_refused_what_it_does_not_need(acl_redis, subjects) -> None:
    fe = await connect_redis(url(acl_redis, "frontend"))
    ix = await connect_redis(url(acl_redis, "indexer"))
    try:
        # the frontend cannot take the indexer's lock, write its maps or wipe anything
        with pytest.raises(NoPermissionError):
            await fe.set(f"jf:{subjects.prefix}:leader", "me")
        frontend_index = RedisPrefixIndex(fe, namespace(subjects.prefix))
        shard = (await frontend_index.ready())[0]
        with pytest.raises(NoPermissionError):
            await fe.hset(shard.keys.pos, "0", 1)
        with pytest.raises(NoPermissionError):
            await fe.flushdb()
        with pytest.raises(NoPermissionError):
            await fe.client_kill_filter(_type="normal")
        with pytest.raises(NoPermissionError):  # the indexer's slot table is not its to write
            await frontend_index.apply("m", "w", 1, 1, [StoreOp("w", (1,))])
        # the indexer owns the namespace, and nothing outside it or above it
        await ix.set(f"jf:{subjects.prefix}:probe", "1")
        with pytest.raises(NoPermissionError):
            await ix.set("other:key", "1")
        with pytest.raises(NoPermissionError):
            await ix.flushall()
        with pytest.raises(NoPermissionError):
            await ix.config_set("appendonly", "no")
    finally:
        await fe.aclose()
        await ix.aclose()


async def test_the_admin_user_administers(acl_redis) -> None:
    """What an operator does as admin: see who is connected as what, read and change the
    configuration, list the users, look at the fleet's keys."""
    admin = await connect_redis(url(acl_redis, "admin"))
    try:
        assert await admin.execute_command("ACL", "WHOAMI") == b"admin"
        assert await admin.config_set("maxmemory-policy", "noeviction")
        assert (await admin.config_get("maxmemory-policy"))["maxmemory-policy"] == "noeviction"
        users = {u.decode() for u in await admin.execute_command("ACL", "USERS")}
        assert users == {"default", "indexer", "frontend", "admin"}
        await admin.set("jf:admin-probe", "1")
        assert [k async for k in admin.scan_iter("jf:admin-probe")] == [b"jf:admin-probe"]
        await admin.delete("jf:admin-probe")
    finally:
        await admin.aclose()
