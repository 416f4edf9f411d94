"""Routes against the index as a kv router makes them (``RedisPrefixIndex.route`` with a
``WorkerPool`` of the fleet and 16 sampled workers), for an index-scale run.

As a process of its own (started by ``tests.bench.index_scale``): under uvloop, open loop at
``--rate`` routes/s (Poisson arrivals scheduled in advance), each route's latency measured from
its scheduled time (no coordinated omission: a slow route does not delay the next one's clock),
each reservation released after a simulated service time; prompts drawn from the chains the
fleet holds plus a fresh suffix, hashed before the clock starts. Writes the latencies as JSON.

In the driver: ``closed_loop`` times routes one after another on an idle index.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

from base.connect import connect_redis
from base.logs import configure_logging
from router.kv.redis_index import RedisPrefixIndex
from router.kv.routing import RouteCall, WorkerPool
from tests.bench.index_scale_env import ready_and_wait_go
from tests.bench.index_scale_fleet import Fleet, FleetSpec, prompt, worker_id
from tests.bench.procstat import self_cpu_seconds

SAMPLE = 16  # workers a kv router samples (router.kv.router: KvRouter._sample)


@dataclass(frozen=True)
class Planned:
    at_s: float  # after the start
    hashes: tuple[int, ...]
    sampled: tuple[str, ...]
    rand: float


def plan(
    fleet: Fleet, pool: WorkerPool, n: int, prompt_blocks: int, rate: float, seed: int
) -> list[Planned]:
    """``n`` routes of prompts from the chains the fleet holds; ``rate`` 0: no schedule."""
    rng = random.Random(seed)
    held = fleet.held_chains()
    at = 0.0
    out = []
    for _ in range(n):
        if rate:
            at += rng.expovariate(rate)
        hashes = prompt(fleet.chains, rng.choice(held), prompt_blocks, rng)
        k = min(SAMPLE, len(pool.workers))
        out.append(Planned(at, hashes, tuple(rng.sample(pool.workers, k)), rng.random()))
    fleet.chains.forget_tails()
    return out


def call_of(model: str, rid: str, p: Planned, pool: WorkerPool) -> RouteCall:
    return RouteCall(
        model, rid, p.hashes, len(p.hashes), pool, p.sampled, rand=p.rand,
        now_ms=int(time.time() * 1000),
    )  # fmt: skip


async def closed_loop(
    index: RedisPrefixIndex, model: str, pool: WorkerPool, planned: list[Planned], tag: str
) -> list[float]:
    """Route each planned request in turn (ms each); release them all afterwards, so the
    index's command statistics over the loop count routes only."""
    lat = []
    for i, p in enumerate(planned):
        call = call_of(model, f"{tag}{i}", p, pool)
        t = time.perf_counter()
        await index.route(call)
        lat.append((time.perf_counter() - t) * 1000)
    for i in range(len(planned)):
        await index.release(f"{tag}{i}")
    return lat


async def open_loop(
    index: RedisPrefixIndex,
    model: str,
    pool: WorkerPool,
    planned: list[Planned],
    t0: float,
    service_ms: tuple[float, float],
) -> dict[str, Any]:
    due_s: list[float] = []
    start_ms: list[float] = []  # how late the call started (the client's own share)
    total_ms: list[float] = []
    errors: list[str] = []
    rng = random.Random(1)

    async def one(i: int, p: Planned, due: float) -> None:
        started = time.monotonic()
        try:
            await index.route(call_of(model, f"r{i}", p, pool))
        except Exception as exc:
            errors.append(repr(exc))
            return
        done = time.monotonic()
        due_s.append(due)
        start_ms.append((started - due) * 1000)
        total_ms.append((done - due) * 1000)
        await asyncio.sleep(rng.uniform(*service_ms) / 1000)
        await index.release(f"r{i}")

    tasks = set()
    for i, p in enumerate(planned):
        due = t0 + p.at_s
        wait = due - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        task = asyncio.create_task(one(i, p, due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    return {"due_s": due_s, "start_ms": start_ms, "total_ms": total_ms, "errors": errors[:20]}


async def run(args: argparse.Namespace, planned: list[Planned], t0: float) -> dict[str, object]:
    spec = FleetSpec.from_json(args.spec)
    redis = await connect_redis(args.redis)
    index = RedisPrefixIndex(redis, args.ns)
    pool = pool_of(args)
    await index.warm()
    await index.load_table(spec.model)
    await asyncio.sleep(max(0.0, t0 - time.monotonic()))
    cpu0 = self_cpu_seconds()
    service = tuple(float(x) for x in args.service_ms.split(","))
    out = await open_loop(index, spec.model, pool, planned, t0, (service[0], service[1]))
    cpu = self_cpu_seconds() - cpu0
    await index.aclose()
    await redis.aclose()
    return {**out, "routes": len(out["total_ms"]), "cpu_s": round(cpu, 3)}


def pool_of(args: argparse.Namespace) -> WorkerPool:
    """The fleet's workers but the departed ones (``--skip``)."""
    gone = {int(w) for w in args.skip.split(",") if w}
    return WorkerPool(tuple(worker_id(w) for w in range(args.pool) if w not in gone))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--redis", required=True)
    ap.add_argument("--ns", required=True)
    ap.add_argument("--spec", required=True, help="FleetSpec as JSON")
    ap.add_argument("--chain", type=int, required=True, help="the fleet's position")
    ap.add_argument("--rate", type=float, required=True, help="routes/s")
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--pool", type=int, required=True, help="workers 0..N-1")
    ap.add_argument("--skip", default="", help="worker indices that departed (not in the pool)")
    ap.add_argument("--prompt-blocks", type=int, default=64)
    ap.add_argument("--service-ms", default="2,6", help="a reservation is held this long")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ready", type=Path, required=True)
    ap.add_argument("--go", type=Path, required=True)
    args = ap.parse_args(argv)
    configure_logging("warning")
    fleet = Fleet(FleetSpec.from_json(args.spec))
    fleet.advance(args.chain)
    pool = pool_of(args)
    n = int(args.rate * args.seconds)
    planned = plan(fleet, pool, n, args.prompt_blocks, args.rate, args.seed)
    t0 = ready_and_wait_go(args.ready, args.go)
    args.out.write_text(json.dumps(uvloop.run(run(args, planned, t0))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
