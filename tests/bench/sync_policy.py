"""What JetStream's fsync policy costs the fleet: the short serving benchmark, side by side, on
nats-server's default (``sync_interval`` 2 min: writes acknowledged at once, fsynced later) and on
``sync_interval: always`` (every write fsynced before it is acknowledged).

    python -m tests.bench.sync_policy                          # 1 node, concurrency 1,16,64, 2 reps
    python -m tests.bench.sync_policy --nodes 3 --reps 3       # a 3-node cluster, streams at R3

Per repetition, the policies run one after the other on fresh fleets (one mocker worker at
``--speedup 10000``, a frontend, round-robin: what ``tests.bench.serving`` measures), so a noisy
neighbour hurts both alike. Prints one JSON document: per policy and concurrency the median over
the repetitions of requests/s, TTFT p50/p99 and ITL p50/p99, and ``always_vs_default`` with each
figure's ratio (always / default). Per request the fleet writes to file streams: the request
(FLEET_REQUESTS), its KV events (FLEET_KV) and its observation (FLEET_METRICS); the token chunks
go to a memory stream and are not synced.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from base.logs import configure_logging
from tests.bench.fleetctl import BenchFleet
from tests.bench.serving import run_one, warm_up

POLICIES = {"default": None, "always": "always"}
FIGURES = ("requests_per_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--requests", type=int, default=0, help="per level (default: 40 x c, >= 100)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=1, choices=(1, 3))
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--speedup", type=float, default=10000.0)
    args = ap.parse_args(argv)
    args.model, args.workers, args.router = "jetfleet-tiny", 1, "round-robin"
    return args


def one_fleet(args: argparse.Namespace, sync: str | None) -> list[dict[str, Any]]:
    worker = ("--speedup", str(args.speedup), "--max-num-seqs", "256")
    with BenchFleet(worker_args=worker, nats_nodes=args.nodes, nats_sync_interval=sync) as fleet:
        warm_up(fleet.url, args.model)
        pids = {k: v for k, v in fleet.pids.items() if k != "redis-server"}
        levels = [int(c) for c in args.concurrency.split(",")]
        return [run_one(fleet.url, c, args, pids) for c in levels]


def medians(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    out = []
    for rows in zip(*runs, strict=True):
        row: dict[str, Any] = {"concurrency": rows[0]["concurrency"]}
        row["errors"] = sum(r["errors"] for r in rows)
        for key in FIGURES:
            row[key] = round(statistics.median(r[key] for r in rows), 3)
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging("warning")
    runs: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in POLICIES}
    for rep in range(args.reps):
        for name, sync in POLICIES.items():
            print(f"rep {rep + 1}/{args.reps}: sync_interval {name}", file=sys.stderr, flush=True)
            runs[name].append(one_fleet(args, sync))
    table = {name: medians(r) for name, r in runs.items()}
    ratios = [
        {"concurrency": a["concurrency"]}
        | {k: round(b[k] / a[k], 3) if a[k] else None for k in FIGURES}
        for a, b in zip(table["default"], table["always"], strict=True)
    ]
    result = {
        "benchmark": "sync_policy",
        "nats_nodes": args.nodes,
        "reps": args.reps,
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        "speedup": args.speedup,
        "policies": table,
        "always_vs_default": ratios,
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
