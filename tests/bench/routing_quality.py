"""Routing quality: how much of the prompt the chosen workers already had cached.

    python -m tests.bench.routing_quality [--policies kv,round-robin,random] [--requests 600]

Per policy, a fresh fleet (caches cold): 4 mocker workers at speedup 1 with a small cache
(192 blocks of 64 tokens each), 20 shared 1024-token prefixes, each request one prefix (uniform
at random) plus 128 unique tokens, 32 output tokens, concurrency 16. Reports the share of prompt
tokens served from cache (from each response's ``usage.prompt_tokens_details.cached_tokens``),
TTFT p50/p99 and the total time, side by side. Perfect affinity would serve about 85%.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import string
import sys

from base.logs import configure_logging
from tests.bench.fleetctl import BenchFleet
from tests.bench.loadgen import percentile, run_level


def workload(
    requests: int, prefixes: int, prefix_tokens: int, unique_tokens: int, seed: int
) -> list[str]:
    rng = random.Random(seed)
    letters = string.ascii_letters + " "
    heads = ["".join(rng.choices(letters, k=prefix_tokens)) for _ in range(prefixes)]
    return [
        rng.choice(heads) + "".join(rng.choices(letters, k=unique_tokens)) for _ in range(requests)
    ]


def run_policy(policy: str, prompts: list[str], args: argparse.Namespace) -> dict[str, object]:
    worker_args = (
        "--speedup",
        str(args.speedup),
        "--num-gpu-blocks",
        str(args.num_gpu_blocks),
        "--block-size",
        str(args.block_size),
    )
    extra = (
        "--kv-prefill-weight",
        str(args.kv_prefill_weight),
        "--kv-prefill-overhead",
        str(args.kv_prefill_overhead),
        "--kv-temperature",
        str(args.kv_temperature),
    )
    with BenchFleet(
        workers=args.workers, worker_args=worker_args, router=policy, frontend_args=extra
    ) as fleet:
        level = asyncio.run(
            run_level(
                fleet.url,
                "jetfleet-tiny",
                args.concurrency,
                len(prompts),
                0,
                args.output_tokens,
                prompts=prompts,
            )
        )
    ok = [r for r in level.results if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    ttft = [r.ttft_s * 1000 for r in ok]
    # after the cold burst: the first `concurrency` requests all miss on idle workers at once
    warm = [r.ttft_s * 1000 for r in ok if r.start_index >= args.concurrency]
    return {
        "policy": policy,
        "kv_prefill_weight": args.kv_prefill_weight if policy == "kv" else None,
        "kv_prefill_overhead": args.kv_prefill_overhead if policy == "kv" else None,
        "kv_temperature": args.kv_temperature if policy == "kv" else None,
        "requests": len(level.results),
        "errors": len(level.results) - len(ok),
        "cached_share": round(cached / prompt, 4) if prompt else 0.0,
        "ttft_ms_p50": round(percentile(ttft, 50), 1),
        "ttft_ms_p90": round(percentile(ttft, 90), 1),
        "ttft_ms_p99": round(percentile(ttft, 99), 1),
        "warm_ttft_ms_p99": round(percentile(warm, 99), 1),
        "total_s": round(level.wall_s, 2),
    }


MEDIAN_KEYS = (
    "cached_share",
    "ttft_ms_p50",
    "ttft_ms_p90",
    "ttft_ms_p99",
    "warm_ttft_ms_p99",
    "total_s",
    "errors",
)


def medians(rows: list[dict[str, object]]) -> dict[str, float]:
    return {k: statistics.median(float(r[k]) for r in rows) for k in MEDIAN_KEYS}  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--policies", default="kv,round-robin,random")
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--num-gpu-blocks", type=int, default=192)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--prefixes", type=int, default=20)
    ap.add_argument("--prefix-tokens", type=int, default=1024)
    ap.add_argument("--unique-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--speedup", type=float, default=1.0)
    ap.add_argument("--kv-prefill-weight", type=float, default=8.0)
    ap.add_argument("--kv-prefill-overhead", type=int, default=4)
    ap.add_argument("--kv-temperature", type=float, default=8.0)
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds, policies interleaved; the summary gives each figure's median per policy",
    )
    ap.add_argument("--workload-seed", type=int, default=0)
    args = ap.parse_args(argv)
    configure_logging("warning")
    prompts = workload(
        args.requests, args.prefixes, args.prefix_tokens, args.unique_tokens, args.workload_seed
    )
    policies = args.policies.split(",")
    rows = []
    for _ in range(args.repeat):
        for policy in policies:
            row = run_policy(policy, prompts, args)
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    print(
        json.dumps(
            {
                "benchmark": "routing_quality",
                "workers": args.workers,
                "num_gpu_blocks": args.num_gpu_blocks,
                "block_size": args.block_size,
                "prefixes": args.prefixes,
                "concurrency": args.concurrency,
                "repeat": args.repeat,
                "medians": {p: medians([r for r in rows if r["policy"] == p]) for p in policies},
                "results": rows,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
