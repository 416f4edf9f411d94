"""The prefix index alone at fleet scale: memory, route latency, ingest, lag and stalls.

    python -m tests.bench.index_scale [--configs single,cluster,cluster-2g] [--workers 256]
        [--holder-blocks 1000000,4000000] [--rate 100000] [--route-rate 1000] [--cell-seconds 20]

No engines and no frontends: W fake workers (``index_scale_fleet``: chains of 64 blocks under
several hundred branches, each chain held by 3 random workers, prefix-closed) registered in the
workers bucket and publishing ``KvEventBatch`` v3 (through ``KvRelay``) on FLEET_KV from an event
generator process; a ``jetfleet indexer`` process applying them to Redis; a router client process
routing as the kv router does. Per configuration (``--configs``):

- ``single``: one redis-server, one indexer group;
- ``cluster``: a 3-master Redis Cluster (the index finds it from the seed URL: 3 shards), one
  indexer group;
- ``cluster-2g``: the same cluster, ``--indexer-groups 2`` (two indexers, each leads a group).

Phases, each configuration in fresh servers (``--phases`` selects among the optional ones):

1. fill to each ``--holder-blocks`` size through the real path (generator -> NATS -> indexer),
   Redis ``used_memory`` (every node) and the indexer's RSS before and after; idle routes at each
   size (on a cluster: the largest size only);
2. ``sweep`` (single): idle routes at pools of ``--sweep-pools`` workers x prompts of
   ``--sweep-prompts`` blocks (16 sampled, as the kv router does); the pools larger than the
   fleet get extra workers holding one chain each, added last;
3. ``load``: the main load cell: ``--rate`` block events/s of churn (stores of new chains,
   evictions of old ones) and ``--route-rate`` routes/s, open loop, for ``--cell-seconds``;
4. ``probes`` (single): load cells with a worker's departure, a snapshot, an indexer failover;
5. ``backlog``: indexers stopped, ``--backlog-events`` published, the catch-up timed.

One JSON document on stdout, progress on stderr. The keys are described in docs/benchmarks.md
("Index at fleet scale").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

from base.logs import configure_logging
from base.task_trace import tasks_where
from tests.bench.index_scale_cells import (
    Run,
    Sizes,
    add_workers,
    backlog,
    fill,
    idle_routes,
    load_cell,
    per_core,
)
from tests.bench.index_scale_env import Env
from tests.bench.index_scale_fleet import Fleet, FleetSpec, chains_for, worker_id
from tests.bench.index_scale_measure import RedisStats
from tests.bench.index_scale_probes import Departure, Failover, Snapshot

CONFIGS = {"single": (0, 1), "cluster": (3, 1), "cluster-2g": (3, 2)}  # masters, groups
PHASES = ("sweep", "load", "probes", "backlog")


async def run_config(
    name: str, sizes: Sizes, phases: set[str], root: Path, leader_ttl_ms: int
) -> dict[str, Any]:
    masters, groups = CONFIGS[name]
    env = Env(root, masters, groups, leader_ttl_ms=leader_ttl_ms)
    spec = FleetSpec.sized(sizes.workers, max(sizes.holder_blocks), sizes.seed)
    await env.start()
    stats = RedisStats(env.redis_nodes())
    run = Run(env, Fleet(spec), sizes, stats, root / "cells")
    try:
        return await _phases(run, name, phases)
    finally:
        stats.close()
        await env.stop()


async def _phases(run: Run, name: str, phases: set[str]) -> dict[str, Any]:
    env, sizes, spec = run.env, run.sizes, run.fleet.spec
    await env.register([worker_id(i) for i in range(spec.workers)] + env.marker_workers())
    await env.start_indexers(env.groups, "--snapshot-every", "0")
    index = await env.read_index()
    out: dict[str, Any] = {
        "config": name,
        "workers": spec.workers,
        "shards": index.shards.n,
        "indexer_groups": env.groups,
        "fleet": {
            "chains": spec.chains,
            "chain_blocks": spec.chain_blocks,
            "branches": spec.branches,
            "holders_per_chain": spec.holders,
        },
    }
    out |= await _fill(run, name)
    big = sorted(p for p in sizes.sweep_pools if p > spec.workers)
    if "sweep" in phases and env.masters == 0:
        out["candidates"] = await sweep(run, [p for p in sizes.sweep_pools if p <= spec.workers])
    if "load" in phases:
        load = await load_cell(run, "load", sizes.cell_s, None)
        run.log(config=name, phase="load", **_brief(load))
        out |= _headline(load, out["shards"])
        out["load"] = load
    if "probes" in phases and env.masters == 0:
        out["probes"] = await _probes(run, name)
    if "backlog" in phases:
        out["backlog"] = await backlog(run, sizes.backlog_events)
        run.log(config=name, phase="backlog", **out["backlog"])
    if "sweep" in phases and env.masters == 0 and big:
        await add_workers(run, max(big))
        out.setdefault("candidates", []).extend(await sweep(run, big))
    return out


async def _fill(run: Run, name: str) -> dict[str, Any]:
    """Fill to each size (a cluster: the largest), idle routes at each; memory per
    holder-block over all of them."""
    sizes, spec = run.sizes, run.fleet.spec
    targets = sorted(sizes.holder_blocks) if run.env.masters == 0 else [max(sizes.holder_blocks)]
    fills = []
    for target in targets:
        to = chains_for(target, spec.chain_blocks, spec.branch_blocks, spec.holders)
        filled = await fill(run, min(to, spec.chains))
        filled["idle"] = await idle_routes(
            run, spec.workers, sizes.prompt_blocks, sizes.idle_routes, f"i{target}-"
        )
        fills.append(filled)
        run.log(config=name, phase="fill", **{k: v for k, v in filled.items() if k != "cpu_s"})
    first, last = fills[0], fills[-1]
    redis_b = last["redis_used_memory_bytes"][1] - first["redis_used_memory_bytes"][0]
    ix_b = last["indexer_rss_bytes"][1] - first["indexer_rss_bytes"][0]
    n = run.holder_blocks
    return {
        "holder_blocks": n,
        "bytes_per_holder_block": round((redis_b + ix_b) / n, 1),
        "redis_bytes_per_holder_block": round(redis_b / n, 1),
        "indexer_bytes_per_holder_block": round(ix_b / n, 1),
        "idle_route_p50_ms": last["idle"]["route_p50_ms"],
        "idle_route_p99_ms": last["idle"]["route_p99_ms"],
        "fill": fills,
    }


async def _probes(run: Run, name: str) -> list[dict[str, Any]]:
    """A load cell per stall probe; a plain indexer again afterwards."""
    sizes, env = run.sizes, run.env
    cells = []
    for probe in (Departure(), Snapshot(every_s=round(0.4 * sizes.cell_s, 1)), Failover()):
        seconds = sizes.failover_s if isinstance(probe, Failover) else sizes.cell_s
        cell = await load_cell(run, probe.name, seconds, probe)
        run.log(config=name, phase=probe.name, **_brief(cell), **cell["probe"])
        cells.append(cell)
    env.stop_indexers()
    await env.start_indexers(env.groups, "--snapshot-every", "0")
    return cells


async def sweep(run: Run, pools: list[int]) -> list[dict[str, Any]]:
    rows = []
    for pool in pools:
        for blocks in run.sizes.sweep_prompts:
            row = await idle_routes(run, pool, blocks, run.sizes.idle_routes, f"s{pool}-{blocks}-")
            run.log(phase="sweep", **row)
            rows.append(row)
    return rows


def _headline(load: dict[str, Any], shards: int) -> dict[str, Any]:
    keys = (
        "route_p50_ms", "route_p99_ms", "route_max_ms", "max_redis_call_ms",
        "ingest_block_events_per_s", "lag_p50_ms", "lag_p99_ms", "lag_max_ms", "cpu_s",
        "cpu_us_per_block_event", "cpu_us_per_route",
    )  # fmt: skip
    return {k: load[k] for k in keys} | {"per_core_projection": per_core(load, shards)}


def _brief(cell: dict[str, Any]) -> dict[str, Any]:
    keys = ("ingest_block_events_per_s", "route_p50_ms", "route_p99_ms", "lag_p99_ms")
    return {k: cell[k] for k in keys}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )

    def ints(text: str) -> tuple[int, ...]:
        return tuple(int(float(x)) for x in text.split(",") if x)

    d = Sizes()
    ap.add_argument("--configs", default=",".join(CONFIGS), help="of: " + ", ".join(CONFIGS))
    ap.add_argument("--phases", default=",".join(PHASES), help="of: " + ", ".join(PHASES))
    ap.add_argument("--workers", type=int, default=d.workers)
    ap.add_argument("--holder-blocks", type=ints, default=d.holder_blocks, help="fill sizes")
    ap.add_argument("--rate", type=float, default=d.rate, help="block events/s in a load cell")
    ap.add_argument("--route-rate", type=float, default=d.route_rate, help="routes/s")
    ap.add_argument("--cell-seconds", type=float, default=d.cell_s)
    ap.add_argument("--failover-seconds", type=float, default=d.failover_s)
    ap.add_argument("--backlog-events", type=int, default=d.backlog_events)
    ap.add_argument("--idle-routes", type=int, default=d.idle_routes, help="per idle measurement")
    ap.add_argument("--sweep-pools", type=ints, default=d.sweep_pools)
    ap.add_argument("--sweep-prompts", type=ints, default=d.sweep_prompts, help="blocks")
    ap.add_argument("--prompt-blocks", type=int, default=d.prompt_blocks, help="load cells")
    ap.add_argument("--leader-ttl-ms", type=int, default=5000, help="the indexers' lock TTL")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument(
        "--work-dir", type=Path, default=None, help="keep the servers' data and the logs here"
    )
    ap.add_argument(
        "--deadline",
        type=float,
        default=0.0,
        help="past this many seconds, say where every task waits and stop (exit 3; 0: never)",
    )
    args = ap.parse_args(argv)
    checks = (("--configs", args.configs, CONFIGS), ("--phases", args.phases, PHASES))
    for flag, given, known in checks:
        unknown = {x for x in given.split(",") if x} - set(known)
        if unknown:
            ap.error(f"{flag}: unknown {', '.join(sorted(unknown))}")
    return args


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    sizes = Sizes(
        workers=args.workers,
        holder_blocks=args.holder_blocks,
        rate=args.rate,
        route_rate=args.route_rate,
        cell_s=args.cell_seconds,
        failover_s=args.failover_seconds,
        backlog_events=args.backlog_events,
        idle_routes=args.idle_routes,
        sweep_pools=args.sweep_pools,
        sweep_prompts=args.sweep_prompts,
        prompt_blocks=args.prompt_blocks,
        seed=args.seed,
    )
    phases = {p for p in args.phases.split(",") if p}
    out: dict[str, Any] = {
        "benchmark": "index_scale",
        "cores": os.cpu_count(),
        "load_average_at_start": os.getloadavg()[0],
        "sizes": {k: v for k, v in vars(sizes).items()},
        "phases": sorted(phases),
        "fill_path": "event generator -> NATS (FLEET_KV) -> jetfleet indexer -> Redis",
        "configs": [],
    }
    t0 = time.monotonic()
    for name in (c for c in args.configs.split(",") if c):
        with tempfile.TemporaryDirectory(prefix="jetfleet-index-scale-") as tmp:
            root = args.work_dir / name if args.work_dir else Path(tmp)
            t = time.monotonic()
            result = await run_config(name, sizes, phases, root, args.leader_ttl_ms)
            result["wall_s"] = round(time.monotonic() - t, 1)
            out["configs"].append(result)
    out["wall_s"] = round(time.monotonic() - t0, 1)
    return out


async def bounded(args: argparse.Namespace) -> dict[str, Any]:
    """``run_all`` within ``--deadline``: past it, where every task waits goes to stderr (a
    hang then names its await instead of running into the caller's timeout), the run is
    cancelled (its servers and children stopped) and the bench exits 3."""
    run = asyncio.ensure_future(run_all(args))
    if args.deadline <= 0:
        return await run
    done, _ = await asyncio.wait({run}, timeout=args.deadline)
    if run in done:
        return run.result()
    where = tasks_where()
    print(f"index_scale: past its --deadline of {args.deadline:g} s; the tasks:\n{where}",
          file=sys.stderr, flush=True)  # fmt: skip
    run.cancel()
    await asyncio.wait({run}, timeout=30.0)
    raise SystemExit(3)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    configure_logging("warning")  # stdout carries only the JSON
    print(json.dumps(uvloop.run(bounded(args)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
