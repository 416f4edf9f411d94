"""Routing quality: how much of the prompt the chosen workers already had cached.

    python -m tests.bench.routing_quality [--policies kv,round-robin,random] [--requests 600]

Per policy, a fresh fleet (caches cold): 4 mocker workers at speedup 1 with a small cache
(192 blocks of 64 tokens each), 20 shared 1024-token prefixes, each request one prefix (uniform
at random) plus 128 unique tokens, 32 output tokens, concurrency 16. Reports the share of prompt
tokens served from cache (from each response's ``usage.prompt_tokens_details.cached_tokens``),
TTFT p50/p99 and the total time, side by side. Perfect affinity would serve about 85%.

``--tiered N``: the host-memory tier. Every worker gets ``--num-cpu-blocks N`` and four fleets
run the same prompts: ``kv-tiers`` (the router counts a block in a worker's host tier at
``--kv-host-hit-weight``), ``kv-ignoring-tiers`` (host tier on, weight 0), ``round-robin`` (host
tier on) and ``kv-gpu-only`` (no host tier). Each row splits the prompt tokens into those served
from GPU memory, from host memory (the requests' observations) and recomputed. The issue's
workload: ``--tiered 768 --prefixes 40 --prefix-tokens 2048 --unique-tokens 128
--output-tokens 16 --concurrency 12 --requests 500`` (192 GPU blocks of 64 tokens per worker:
the 40 heads need 1,280 blocks, four GPUs hold 768, the host tiers 3,072 more).

``--multiturn``: long conversations instead of shared heads. ``--conversations`` of 5 to 20 turns
(``--turns-min``/``--turns-max``); each turn's prompt is the previous one plus ``--turn-tokens``
new tokens (a reply and the next message), so a 20-turn conversation ends above 30k tokens. The
turns are interleaved round by round in a shuffled order, so one conversation's next turn comes
dozens of requests (and millions of tokens of other traffic) after its last. The workers get a
long-context copy of the model. The issue's run: ``--multiturn --tiered 4096 --num-gpu-blocks
1024 --conversations 40 --turn-tokens 1500 --output-tokens 16 --concurrency 12 --speedup 10``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import string
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import nats

from base.logs import configure_logging
from schemas import RequestObservation, Subjects, decode
from tests.bench.fleetctl import BenchFleet
from tests.bench.loadgen import LevelResult, percentile, run_level
from tests.bench.long_prompts import long_context_copy


@dataclass(frozen=True)
class Variant:
    name: str
    policy: str
    num_cpu_blocks: int = 0
    host_hit_weight: float = 0.0


def tiered_variants(cpu_blocks: int, weight: float) -> list[Variant]:
    return [
        Variant("kv-tiers", "kv", cpu_blocks, weight),
        Variant("kv-ignoring-tiers", "kv", cpu_blocks, 0.0),
        Variant("round-robin", "round-robin", cpu_blocks),
        Variant("kv-gpu-only", "kv", 0),
    ]


def workload(
    requests: int, prefixes: int, prefix_tokens: int, unique_tokens: int, seed: int
) -> list[str]:
    rng = random.Random(seed)
    letters = string.ascii_letters + " "
    heads = ["".join(rng.choices(letters, k=prefix_tokens)) for _ in range(prefixes)]
    return [
        rng.choice(heads) + "".join(rng.choices(letters, k=unique_tokens)) for _ in range(requests)
    ]


async def _measure(
    url: str, nats_url: str, prompts: list[str], args: argparse.Namespace
) -> tuple[LevelResult, list[RequestObservation]]:
    """The load, and the frontend's observation of each request (where its cached tokens
    came from)."""
    nc = await nats.connect(nats_url)
    seen: list[RequestObservation] = []

    async def on_obs(msg: nats.aio.msg.Msg) -> None:
        seen.append(decode(msg.data, RequestObservation))

    await nc.subscribe(Subjects().obs_all(), cb=on_obs)
    try:
        level = await run_level(
            url, "jetfleet-tiny", args.concurrency, len(prompts), 0, args.output_tokens,
            prompts=prompts,
        )  # fmt: skip
        for _ in range(100):  # the last observations trail the responses by milliseconds
            if len(seen) >= len(level.results):
                break
            await asyncio.sleep(0.05)
    finally:
        await nc.close()
    return level, seen


def multiturn(
    conversations: int, turns_min: int, turns_max: int, turn_tokens: int, seed: int
) -> list[str]:
    """Every conversation's turns (each the previous prompt plus ``turn_tokens`` new ones),
    interleaved round by round in a shuffled conversation order."""
    rng = random.Random(seed)
    letters = string.ascii_letters + " "

    def text() -> str:
        return "".join(rng.choices(letters, k=turn_tokens))

    convs: list[list[str]] = []
    for _ in range(conversations):
        history = text()  # the system prompt and the first message
        turns = [history]
        for _ in range(rng.randint(turns_min, turns_max) - 1):
            history += text()
            turns.append(history)
        convs.append(turns)
    out: list[str] = []
    for t in range(turns_max):
        order = [c for c in range(conversations) if t < len(convs[c])]
        rng.shuffle(order)
        out += [convs[c][t] for c in order]
    return out


def run_policy(
    variant: Variant | str, prompts: list[str], args: argparse.Namespace
) -> dict[str, object]:
    v = Variant(variant, variant) if isinstance(variant, str) else variant
    worker_args = (
        "--speedup",
        str(args.speedup),
        "--num-gpu-blocks",
        str(args.num_gpu_blocks),
        "--block-size",
        str(args.block_size),
        "--num-cpu-blocks",
        str(v.num_cpu_blocks),
        *(
            ("--model", args.model_dir, "--served-model-name", "jetfleet-tiny")
            if args.model_dir
            else ()
        ),
    )
    extra = (
        "--kv-prefill-weight",
        str(args.kv_prefill_weight),
        "--kv-prefill-overhead",
        str(args.kv_prefill_overhead),
        "--kv-temperature",
        str(args.kv_temperature),
        "--kv-host-hit-weight",
        str(v.host_hit_weight),
    )
    with BenchFleet(
        workers=args.workers, worker_args=worker_args, router=v.policy, frontend_args=extra
    ) as fleet:
        level, seen = asyncio.run(_measure(fleet.url, fleet.nats.url, prompts, args))
    ok = [r for r in level.results if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    host = sum(o.host_cached_tokens for o in seen if o.status == "ok")
    ttft = [r.ttft_s * 1000 for r in ok]
    # after the cold burst: the first `concurrency` requests all miss on idle workers at once
    warm = [r.ttft_s * 1000 for r in ok if r.start_index >= args.concurrency]
    kv = v.policy == "kv"
    return {
        "policy": v.name,
        "kv_prefill_weight": args.kv_prefill_weight if kv else None,
        "kv_prefill_overhead": args.kv_prefill_overhead if kv else None,
        "kv_temperature": args.kv_temperature if kv else None,
        "num_cpu_blocks": v.num_cpu_blocks,
        "kv_host_hit_weight": v.host_hit_weight if kv else None,
        "requests": len(level.results),
        "errors": len(level.results) - len(ok),
        "cached_share": round(cached / prompt, 4) if prompt else 0.0,
        "gpu_share": round((cached - host) / prompt, 4) if prompt else 0.0,
        "host_share": round(host / prompt, 4) if prompt else 0.0,
        "recomputed_share": round(1 - cached / prompt, 4) if prompt else 0.0,
        "ttft_ms_p50": round(percentile(ttft, 50), 1),
        "ttft_ms_p90": round(percentile(ttft, 90), 1),
        "ttft_ms_p99": round(percentile(ttft, 99), 1),
        "warm_ttft_ms_p99": round(percentile(warm, 99), 1),
        "total_s": round(level.wall_s, 2),
    }


MEDIAN_KEYS = (
    "cached_share",
    "gpu_share",
    "host_share",
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
    ap.add_argument(
        "--tiered",
        type=int,
        default=0,
        metavar="N",
        help="host tiers of N blocks per worker: the four fleets of the docstring",
    )
    ap.add_argument("--kv-host-hit-weight", type=float, default=0.75)
    ap.add_argument("--multiturn", action="store_true", help="long conversations (docstring)")
    ap.add_argument("--conversations", type=int, default=40)
    ap.add_argument("--turns-min", type=int, default=5)
    ap.add_argument("--turns-max", type=int, default=20)
    ap.add_argument("--turn-tokens", type=int, default=1500)
    args = ap.parse_args(argv)
    configure_logging("warning")
    args.model_dir = None
    if args.multiturn:
        prompts = multiturn(
            args.conversations, args.turns_min, args.turns_max, args.turn_tokens,
            args.workload_seed,
        )  # fmt: skip
        args.requests = len(prompts)
        tmp = tempfile.TemporaryDirectory(prefix="jetfleet-multiturn-")
        args.model_dir = str(long_context_copy(Path(tmp.name)))
    else:
        prompts = workload(
            args.requests, args.prefixes, args.prefix_tokens, args.unique_tokens,
            args.workload_seed,
        )  # fmt: skip
    variants = (
        tiered_variants(args.tiered, args.kv_host_hit_weight)
        if args.tiered
        else [Variant(p, p) for p in args.policies.split(",")]
    )
    policies = [v.name for v in variants]
    rows = []
    for _ in range(args.repeat):
        for variant in variants:
            row = run_policy(variant, prompts, args)
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    print(
        json.dumps(
            {
                "benchmark": "routing_quality",
                "workload": "multiturn" if args.multiturn else "shared-prefixes",
                "requests": args.requests,
                "prompt_tokens_total": sum(len(p) for p in prompts),
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
