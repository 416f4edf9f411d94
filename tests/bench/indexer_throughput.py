"""Indexer throughput: block events applied per second by one indexer process, from a backlog.

    python -m tests.bench.indexer_throughput [--events 1000000] [--workers 16] [--blocks 64]

Publishes a backlog of ``KvEventBatch``es on FLEET_KV as workers send them (version 3: the
fleet's hashes, no token ids; 16 workers, 64-block stored runs, and every fourth batch removing
an earlier run), then starts one ``jetfleet indexer`` process on an empty Redis and times how
long it takes until the position it stores in Redis reaches the last stream sequence. Prints
block events/s, the catch-up time, and CPU seconds of the indexer and of redis-server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from base.connect import close_nats, connect_nats, connect_redis
from base.logs import configure_logging
from base.process import ProcessGroup
from base.topology import ensure_topology
from infra.command import cli_command
from infra.embedded import EmbeddedNats, EmbeddedRedis
from router.kv.keys import namespace
from router.kv.redis_index import RedisPrefixIndex
from schemas import KvEventBatch, Subjects, encode
from schemas.hashing import block_hashes
from schemas.kv_events import BlockRemoved, BlockStored
from tests.bench.procstat import cpu_seconds


def backlog(events: int, workers: int, blocks: int, block_size: int, seed: int = 0):
    """Yield (worker, batch) until ``events`` block events were produced."""
    rng = random.Random(seed)
    runs: dict[str, list[tuple[int, ...]]] = {f"w{i:02d}": [] for i in range(workers)}
    event_ids = dict.fromkeys(runs, 0)
    produced = 0
    n = 0
    while produced < events:
        w = f"w{n % workers:02d}"
        n += 1
        event_ids[w] += 1
        if n % 4 == 0 and runs[w]:
            gone = runs[w].pop(0)
            ev = BlockRemoved(gone)
            produced += len(gone)
        else:
            toks = tuple(rng.randrange(50000) for _ in range(blocks * block_size))
            hashes = tuple(block_hashes(toks, block_size))
            ev = BlockStored(hashes, None)
            runs[w].append(hashes)
            produced += blocks
        yield w, KvEventBatch(w, "m", event_ids[w], time.time(), (ev,))


async def publish_backlog(
    nats_url: str, subjects: Subjects, args: argparse.Namespace
) -> tuple[int, int]:
    nc = await connect_nats(nats_url, name="bench-publisher")
    js = nc.jetstream()
    await ensure_topology(js, subjects)
    total = 0
    batches = backlog(args.events, args.workers, args.blocks, args.block_size)
    count = 0
    for count, (w, batch) in enumerate(batches, 1):
        await nc.publish(subjects.kv("m", w), encode(batch))
        total += sum(len(getattr(e, "block_hashes", ())) for e in batch.events)
        if count % 2000 == 0:
            await nc.flush()
    await nc.flush()
    # a flush does not mean stored: wait until the stream holds every message published
    info = await js.stream_info(subjects.stream_name("KV"))
    while info.state.messages < count:
        await asyncio.sleep(0.05)
        info = await js.stream_info(subjects.stream_name("KV"))
    await close_nats(nc)
    return total, info.state.last_seq


async def wait_applied(redis_url: str, ns: str, last: int, timeout_s: float) -> float:
    redis = await connect_redis(redis_url)
    index = RedisPrefixIndex(redis, ns)
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < timeout_s:
            if await index.applied_seq() >= last:
                return time.monotonic() - t0
            await asyncio.sleep(0.05)
        raise TimeoutError(f"indexer did not reach seq {last} in {timeout_s}s")
    finally:
        await redis.aclose()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args(argv)
    configure_logging("warning")
    subjects = Subjects("fleet")
    with tempfile.TemporaryDirectory(prefix="jetfleet-bench-") as tmp:
        nats = EmbeddedNats(Path(tmp) / "nats", port=0)
        nats.start()
        redis = EmbeddedRedis(Path(tmp) / "redis", port=0)
        redis.start()
        group = ProcessGroup(Path(tmp) / "logs")
        try:
            t0 = time.monotonic()
            events, last = asyncio.run(publish_backlog(nats.url, subjects, args))
            publish_s = time.monotonic() - t0
            print(
                json.dumps(
                    {
                        "published_block_events": events,
                        "messages": last,
                        "publish_s": round(publish_s, 2),
                    }
                ),
                file=sys.stderr,
            )
            redis_cpu0 = cpu_seconds(redis.pid)
            child = group.start(
                "indexer",
                cli_command(
                    "indexer", "--nats", nats.url, "--redis", redis.url, "--log-level", "warning"
                ),
            )
            catch_up = asyncio.run(wait_applied(redis.url, namespace("fleet"), last, args.timeout))
            out = {
                "benchmark": "indexer_throughput",
                "block_events": events,
                "messages": last,
                "blocks_per_stored_event": args.blocks,
                "catch_up_s": round(catch_up, 2),
                "block_events_per_s": round(events / catch_up),
                "indexer_cpu_s": round(cpu_seconds(child.proc.pid), 2),
                "redis_cpu_s": round(cpu_seconds(redis.pid) - redis_cpu0, 2),
                "note": "catch-up includes the indexer process start (~1 s of imports)",
            }
            print(json.dumps(out, indent=2))
        finally:
            group.stop_all(timeout_s=10)
            redis.stop()
            nats.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
