"""The Redis index answers exactly as the in-memory one on random event streams.

Redis bisects the chains of workers whose blocks are prefix-closed and walks the others block by
block (``router/kv/shape.py``); the in-memory index always walks. Streams here evict middle blocks
(holes), store them again, branch, clear, mix engines hashing like the fleet with opaque ones, and
restart the translator half way from what Redis holds (as a restarted indexer does).
"""

from __future__ import annotations

import random
import uuid

import pytest

from base.connect import connect_redis
from router.kv.index import InMemoryPrefixIndex
from router.kv.keys import KvKeys
from router.kv.redis_index import RedisPrefixIndex
from router.kv.routing import CandidateLoad, RouteCall
from router.kv.translate import EventTranslator, ShapeOp
from schemas.hashing import block_hashes
from schemas.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEventBatch
from tests.support.kv_events import kv_batch

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
        return kv_batch(w, self.eid[w], ev, model=M)

    def queries(self) -> list[tuple[int, ...]]:
        out = []
        for h in self.fleet:
            out.append(h)
            out.append(h[: self.rng.randint(0, len(h))])
            out.append((*h[: self.rng.randint(1, len(h))], self.rng.getrandbits(64)))
        return out


@pytest.fixture
async def redis_index(redis_url):
    r = await connect_redis(redis_url)
    yield RedisPrefixIndex(r, KvKeys(f"jf:eq{uuid.uuid4().hex[:8]}"), max_blocks_per_call=7)
    await r.aclose()


async def compare(world: World, mem: InMemoryPrefixIndex, red: RedisPrefixIndex) -> None:
    cands = tuple(CandidateLoad(w) for w in world.workers)
    for q in world.queries():
        expect = await mem.match(M, q)
        assert await red.match(M, q) == expect, q
        out = await red.route(RouteCall(M, "", q, len(q), cands, now_ms=1))
        assert out.overlaps == tuple(expect.get(w, 0) for w in world.workers)


@pytest.mark.parametrize("seed", range(6))
async def test_random_streams_match_the_in_memory_index(redis_index, seed):
    rng = random.Random(seed)
    world = World(rng, workers=10)
    mem, tr_mem, tr_red = InMemoryPrefixIndex(), EventTranslator(), EventTranslator()
    shapes = {True: 0, False: 0}
    for seq in range(1, 401):
        b = world.step()
        ops_mem = tr_mem.translate(b).ops
        ops_red = tr_red.translate(b).ops
        for op in ops_red:
            if isinstance(op, ShapeOp):
                shapes[op.hole_free] += 1
        await mem.apply(M, b.worker_id, b.event_id, seq, ops_mem)
        await redis_index.apply_many([(M, b.worker_id, b.event_id, seq, ops_red)])
        if seq % 50 == 0:
            await compare(world, mem, redis_index)
        if seq == 200:  # the indexer restarts: its translator is refilled from Redis
            tr_red = EventTranslator()
            for w in world.workers:
                blocks = await redis_index.worker_blocks(M, w)
                tr_red.preload(w, blocks.mapping, blocks.parents)
    assert shapes[True] and shapes[False], shapes  # both ways of matching were exercised
    assert await redis_index.dump() == mem.dump()


async def test_long_chains_both_ways(redis_index):
    """A chain longer than one command's arguments (Lua's unpack limit) bisected and walked."""
    toks = list(range(9000 * BS))
    h = tuple(block_hashes(toks, BS))
    tr = EventTranslator()
    await redis_index.apply(
        M,
        "a",
        1,
        0,
        tr.translate(kv_batch("a", 1, BlockStored(h, None, tuple(toks), BS), model=M)).ops,
    )
    await redis_index.apply(
        M,
        "b",
        1,
        0,
        tr.translate(kv_batch("b", 1, BlockStored(h, None, tuple(toks), BS), model=M)).ops,
    )
    await redis_index.apply(
        M, "b", 2, 0, tr.translate(kv_batch("b", 2, BlockRemoved((h[7000],)), model=M)).ops
    )
    assert await redis_index.match(M, h) == {"a": 9000, "b": 7000}
