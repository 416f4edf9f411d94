"""Serving benchmark: the fleet's own overhead, driven over HTTP by a streaming load client.

    python -m tests.bench.serving [--concurrency 1,16,64] [--requests 2000] [--speedup 10000]

Starts a private nats-server, one mocker worker at a very high speedup (so the engine costs next to
nothing and the frontend, broker and worker runtime are what is measured) and a frontend; then, per
concurrency level, streams ~512-token prompts for 64 output tokens each and prints one JSON object:
requests/s, output tokens/s, TTFT p50/p99, ITL p50/p99 and the CPU seconds each process used.
``--url`` measures an already running fleet instead (no CPU figures then).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import urllib.request

from base.logs import configure_logging
from tests.bench.fleetctl import BenchFleet
from tests.bench.loadgen import run_level, summarize
from tests.bench.procstat import CpuMeter


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument(
        "--requests",
        type=int,
        default=0,
        help="requests per level (default: max(100, 40 x concurrency))",
    )
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--speedup", type=float, default=10000.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--router", default="round-robin")
    ap.add_argument("--flush-interval-ms", type=float, default=5.0)
    ap.add_argument("--url", default=None, help="benchmark a running fleet at this base URL")
    ap.add_argument("--model", default="jetfleet-tiny")
    return ap.parse_args(argv)


def warm_up(url: str, model: str) -> None:
    body = json.dumps({"model": model, "prompt": "warm up", "max_tokens": 4}).encode()
    req = urllib.request.Request(
        f"{url}/v1/completions", body, {"content-type": "application/json"}
    )
    for _ in range(20):
        urllib.request.urlopen(req, timeout=30).read()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging("warning")  # logs to stderr; stdout carries only the JSON
    levels = [int(c) for c in args.concurrency.split(",")]
    with contextlib.ExitStack() as stack:
        url, pids = args.url, {}
        if url is None:
            fleet = stack.enter_context(
                BenchFleet(
                    workers=args.workers,
                    router=args.router,
                    worker_args=(
                        "--speedup",
                        str(args.speedup),
                        "--max-num-seqs",
                        "256",
                        "--flush-interval-ms",
                        str(args.flush_interval_ms),
                    ),
                )
            )
            url, pids = fleet.url, {k: v for k, v in fleet.pids.items() if k != "redis-server"}
        warm_up(url, args.model)
        out = [run_one(url, c, args, pids) for c in levels]
    print(
        json.dumps(
            {
                "benchmark": "serving",
                "prompt_tokens": args.prompt_tokens,
                "output_tokens": args.output_tokens,
                "speedup": args.speedup,
                "workers": args.workers,
                "router": args.router,
                "flush_interval_ms": args.flush_interval_ms,
                "levels": out,
            },
            indent=2,
        )
    )
    return 0


def run_one(url: str, concurrency: int, args: argparse.Namespace, pids: dict[str, int]) -> dict:
    n = args.requests or max(100, 40 * concurrency)
    meter = CpuMeter(pids)
    meter.start()
    level = asyncio.run(
        run_level(
            url,
            args.model,
            concurrency,
            n,
            args.prompt_tokens,
            args.output_tokens,
            seed=concurrency,
        )
    )
    cpu = meter.stop()
    row: dict = summarize(level)
    row["cpu_s"] = cpu
    # milliseconds of CPU per request, per process
    row["cpu_ms_per_request"] = {
        k: round(v / max(row["requests"], 1) * 1000, 3) for k, v in cpu.items()
    }
    errors = [r.error for r in level.results if not r.ok][:3]
    if errors:
        row["error_samples"] = errors
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


if __name__ == "__main__":
    sys.exit(main())
