"""Match latency: the one-round-trip route call for long prompts across many workers.

    python -m tests.bench.match_latency [--workers 64] [--prompt-tokens 8192] [--calls 2000]

A private redis-server; ``--workers`` workers; a pool of 32 prompts sharing a 2048-token system
prompt. Each worker caches the blocks of a few pool prompts (so several workers hold long
prefixes of any query, as in a busy fleet), fed as ``BlockStored`` events through a worker's
``KvRelay`` (fleet hashes, as the mocker's). Then ``route`` is timed for pool prompts with a fresh
suffix, as the kv router calls it (the whole fleet as its pool, 16 workers sampled, the holders of
the deepest blocks found by the index): match + score + pick + reserve in one EVALSHA, p50/p99 in
ms, measured from Python under uvloop as the frontend runs (so the figures include the client
round trip), each reservation released after its call. Scenarios:
- ``typical``: as above;
- ``all_hold_all``: every worker holds every block of the query;
- ``holes``: as ``typical``, but every worker then evicted one block in the middle of one of its
  prompts while keeping the blocks after it, so no worker's cache is prefix-closed and every
  match walks block by block (the slow path; see ``workers/kv_shape.py``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time

import uvloop

from base.connect import connect_redis
from base.logs import configure_logging
from infra.embedded import EmbeddedRedis
from router.kv.redis_index import RedisPrefixIndex
from router.kv.routing import RouteCall, WorkerPool
from router.kv.translate import fleet_hashes_for_prompt, ops_of
from schemas.hashing import block_hashes
from schemas.kv_events import BlockRemoved, BlockStored, KvEventBatch
from tests.bench.loadgen import percentile
from workers.kv_relay import KvRelay


async def populate(
    index: RedisPrefixIndex,
    workers: list[str],
    prompts: list[list[int]],
    per_worker: int,
    rng: random.Random,
    everyone: bool,
    holes: bool = False,
) -> None:
    for w in workers:
        chosen = prompts if everyone else rng.sample(prompts, per_worker)
        stored = [BlockStored(tuple(block_hashes(p, 16)), None, tuple(p), 16) for p in chosen]
        relay = KvRelay(True, 4)
        batches = [KvEventBatch(w, "m", 1, 0.0, tuple(relay.relay(stored)))]
        if holes:  # a middle block of the first prompt goes, its successors stay
            middle = stored[0].block_hashes[len(stored[0].block_hashes) // 2]
            gone = relay.relay([BlockRemoved((middle,))])
            batches.append(KvEventBatch(w, "m", 2, 0.0, tuple(gone)))
        for b in batches:
            await index.apply("m", w, b.event_id, 0, ops_of(b))


async def time_routes(
    index: RedisPrefixIndex,
    workers: list[str],
    prompts: list[list[int]],
    calls: int,
    rng: random.Random,
) -> dict[str, float]:
    pool = WorkerPool(tuple(workers))
    await index.load_table("m")
    lat = []
    overlaps = []
    for i in range(calls):
        p = [*rng.choice(prompts), *(rng.randrange(256) for _ in range(16))]
        h = tuple(fleet_hashes_for_prompt(p, 16))
        call = RouteCall(
            "m",
            f"r{i}",
            h,
            -(-len(p) // 16),
            pool,
            tuple(rng.sample(workers, min(16, len(workers)))),
            rand=rng.random(),
            now_ms=int(time.time() * 1000),
        )
        t0 = time.perf_counter()
        out = await index.route(call)
        lat.append((time.perf_counter() - t0) * 1000)
        overlaps.append(max(s.overlap_blocks for s in out.scored))
        await index.release(f"r{i}")
    return {
        "p50_ms": round(percentile(lat, 50), 3),
        "p99_ms": round(percentile(lat, 99), 3),
        "mean_ms": round(sum(lat) / len(lat), 3),
        "mean_best_overlap_blocks": round(sum(overlaps) / len(overlaps), 1),
    }


async def run(args: argparse.Namespace) -> dict[str, object]:
    rng = random.Random(0)
    system = [rng.randrange(256) for _ in range(2048)]
    prompts = [
        system + [rng.randrange(256) for _ in range(args.prompt_tokens - 2048)] for _ in range(32)
    ]
    workers = [f"w{i:03d}" for i in range(args.workers)]
    out: dict[str, object] = {
        "benchmark": "match_latency",
        "workers": args.workers,
        "prompt_tokens": args.prompt_tokens,
        "blocks_per_prompt": args.prompt_tokens // 16,
    }
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(tmp, port=0)
        server.start()
        try:
            redis = await connect_redis(server.url)
            scenarios = (("typical", False, False), ("all_hold_all", True, False))
            for scenario, everyone, holes in (*scenarios, ("holes", False, True)):
                index = RedisPrefixIndex(redis, f"jf:bench{scenario}", writer=True)
                await populate(index, workers, prompts, 4, rng, everyone, holes)
                await time_routes(index, workers, prompts, 50, rng)  # warm up
                out[scenario] = await time_routes(index, workers, prompts, args.calls, rng)
                print(json.dumps({scenario: out[scenario]}), file=sys.stderr)
            await redis.aclose()
        finally:
            server.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=8192)
    ap.add_argument("--calls", type=int, default=2000)
    configure_logging("warning")  # stdout carries only the JSON
    print(json.dumps(uvloop.run(run(ap.parse_args(argv))), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
