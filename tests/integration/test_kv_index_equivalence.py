"""The Redis index answers exactly as the in-memory one on random event streams.

Redis bisects the chains of workers whose blocks are prefix-closed and walks the others block by
block (``workers/kv_shape.py``); the in-memory index always walks. Streams here evict middle
blocks (holes), store them again, branch, clear, mix engines hashing like the fleet with opaque
ones (translated by each worker's relay), and restart the indexer half way (a new process: cold
caches over what Redis holds), on one shard and on three.
"""

from __future__ import annotations

import random
import uuid

import pytest

from base.connect import connect_redis
from router.kv.index import InMemoryPrefixIndex
from router.kv.redis_index import RedisPrefixIndex
from router.kv.routing import RouteCall, WorkerPool
from router.kv.translate import ShapeOp, ops_of
from schemas.hashing import block_hashes
from schemas.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEventBatch
from tests.support.kv_events import kv_batch
from workers.kv_relay import KvRelay

pytestmark = pytest.mark.integration

BS = 2
M = "m"


class World:
    """Prompts sharing prefixes, and per worker what its engine holds (to emit valid events)."""

    def __init__(self, rng: random.Random, workers: int) -> None:
        self.rng = rng
        roots = [[rng.randrange(50) for _ in range(BS * 6)] for _ in range(3)]
        self.prompts = [
            r[: BS * rng.randint(1, 6)] + [rng.randrange(50) for _ in range(BS * rng.randint(1, 8))]
            for r in roots
            for _ in range(4)
        ]
        self.fleet = [tuple(block_hashes(p, BS)) for p in self.prompts]
        self.workers = [f"w{i}" for i in range(workers)]
        # half the engines hash like the fleet, the others with their own (opaque) hashes
        self.salt = {
            w: (0 if i % 2 == 0 else 0x5A5A << (i % 7)) for i, w in enumerate(self.workers)
        }
        self.held: dict[str, set[int]] = {w: set() for w in self.workers}  # engine hashes
        self.eid = dict.fromkeys(self.workers, 0)
        self.relays = {w: KvRelay(self.salt[w] == 0, 4) for w in self.workers}

    def engine(self, w: str, h: int) -> int:
        return h ^ self.salt[w]

    def step(self) -> KvEventBatch:
        rng, w = self.rng, self.rng.choice(self.workers)
        held = self.held[w]
        r = rng.random()
        if r < 0.6:
            p = rng.randrange(len(self.prompts))
            chain = [self.engine(w, h) for h in self.fleet[p]]
            k = 0
            while k < len(chain) and chain[k] in held:
                k += 1
            if k == len(chain):
                k = rng.randrange(len(chain))  # store again what it holds (a no-op for bits)
            n = rng.randint(1, len(chain) - k)
            run = tuple(chain[k : k + n])
            ev = BlockStored(
                run, chain[k - 1] if k else None, tuple(self.prompts[p][k * BS : (k + n) * BS]), BS
            )
            held.update(run)
        elif r < 0.95 and held:
            gone = tuple(rng.sample(sorted(held), min(len(held), rng.randint(1, 3))))
            held.difference_update(gone)
            ev = BlockRemoved(gone)
        else:
            held.clear()
            ev = AllBlocksCleared()
        self.eid[w] += 1
        return kv_batch(w, self.eid[w], *self.relays[w].relay([ev]), model=M)

    def queries(self) -> list[tuple[int, ...]]:
        out = []
        for h in self.fleet:
            out.append(h)
            out.append(h[: self.rng.randint(0, len(h))])
            out.append((*h[: self.rng.randint(1, len(h))], self.rng.getrandbits(64)))
        return out


@pytest.fixture(params=[1, 3], ids=["1-shard", "3-shards"])
async def redis_index(redis_url, request):
    r = await connect_redis(redis_url)
    ns = f"jf:eq{uuid.uuid4().hex[:8]}"
    yield RedisPrefixIndex(r, ns, request.param, max_blocks_per_call=7, writer=True)
    await r.aclose()


async def compare(world: World, mem: InMemoryPrefixIndex, red: RedisPrefixIndex) -> None:
    pool = WorkerPool(tuple(world.workers))
    await red.book.sync(force=True)  # the other shards' copies of the slot table (every 100 ms)
    await red.load_table(M)
    for q in world.queries():
        expect = await mem.match(M, q)
        assert await red.match(M, q) == expect, q
        out = await red.route(RouteCall(M, "", q, len(q), pool, pool.workers, now_ms=1))
        assert {s.worker_id: s.overlap_blocks for s in out.scored} == {
            w: expect.get(w, 0) for w in world.workers
        }
        # two sampled, the others found as holders: the same overlaps as the in-memory index
        sampled = tuple(world.workers[:2])
        got = await red.route(RouteCall(M, "", q, len(q), pool, sampled, now_ms=1))
        want = await mem.route(RouteCall(M, "", q, len(q), pool, sampled, now_ms=1))
        assert got.by_worker().keys() == want.by_worker().keys(), q
        assert {w: s.overlap_blocks for w, s in got.by_worker().items()} == {
            w: s.overlap_blocks for w, s in want.by_worker().items()
        }


@pytest.mark.parametrize("seed", range(6))
async def test_random_streams_match_the_in_memory_index(redis_index, seed):
    rng = random.Random(seed)
    world = World(rng, workers=10)
    mem = InMemoryPrefixIndex()
    shapes = {True: 0, False: 0}
    for seq in range(1, 401):
        b = world.step()
        ops = ops_of(b)
        for op in ops:
            if isinstance(op, ShapeOp):
                shapes[op.hole_free] += 1
        await mem.apply(M, b.worker_id, b.event_id, seq, ops)
        await redis_index.apply_many([(M, b.worker_id, b.event_id, seq, ops)])
        if seq % 50 == 0:
            await compare(world, mem, redis_index)
        if seq == 200:  # the indexer restarts: a new process, nothing cached
            redis_index = RedisPrefixIndex(
                redis_index.redis, redis_index.ns, redis_index.shards.n, 7, writer=True
            )
    assert shapes[True] and shapes[False], shapes  # both ways of matching were exercised
    assert await redis_index.dump() == mem.dump()


async def test_long_chains_both_ways(redis_index):
    """A chain longer than one command's arguments (Lua's unpack limit) bisected and walked."""
    toks = list(range(9000 * BS))
    h = tuple(block_hashes(toks, BS))
    relays = {w: KvRelay(True, 4) for w in ("a", "b")}

    def ops(w: str, eid: int, ev) -> list:
        return ops_of(kv_batch(w, eid, *relays[w].relay([ev]), model=M))

    await redis_index.apply(M, "a", 1, 0, ops("a", 1, BlockStored(h, None, tuple(toks), BS)))
    await redis_index.apply(M, "b", 1, 0, ops("b", 1, BlockStored(h, None, tuple(toks), BS)))
    await redis_index.apply(M, "b", 2, 0, ops("b", 2, BlockRemoved((h[7000],))))
    assert await redis_index.match(M, h) == {"a": 9000, "b": 7000}
