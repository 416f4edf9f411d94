"""Disaggregated against aggregated serving, same worker budget, side by side.

    python -m tests.bench.disagg [--workloads long,short] [--configs agg4,1p3d,2p2d,cond2p2d]

Four mocker workers at speedup 1 (real time), KV-aware routing, the shipped card (Llama-3.1-8B's
KV geometry: 2 MiB a 16-token block; 64 GB/s links): aggregated x4; 1 prefill + 3 decode and
2 + 2 with every prefill remote (``--disagg-policy always``); 2 + 2 conditional
(``isl_or_load``, the default). Workloads (closed loop): ``long`` fresh prompts of 7,936
tokens, 256 out, c=8; ``short`` 8 shared 1,024-token prefixes + 64 fresh tokens, 64 out, c=16.
Reports TTFT and ITL p50/p99 (``itl``: each request's mean, p99 over requests; ``token_itl``:
every token's gap, p99 over tokens: where a prefill stalling a decode batch shows),
throughput, goodput (requests/s within the TTFT and ITL targets), the share prefilled locally
and the mean KV transfer time (from the frontend's metrics). Prints one JSON object with every
run (and each run on stderr as it ends).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import string
import sys
import threading
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from base.logs import configure_logging
from tests.bench.fleetctl import BenchFleet
from tests.bench.loadgen import LevelResult, RequestResult, percentile, run_level
from tests.bench.planner_ramp import Pool

SPLIT = ("prefill", "prefill", "decode", "decode")
PLACEMENTS = "jetfleet_frontend_disagg_placements_total"
TRANSFER = "jetfleet_frontend_kv_transfer_seconds"
CONFIGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {  # roles, frontend flags
    "agg4": (("agg",) * 4, ("--disagg-policy", "never")),
    "1p3d": (("prefill", "decode", "decode", "decode"), ("--disagg-policy", "always")),
    "2p2d": (SPLIT, ("--disagg-policy", "always")),
    "cond2p2d": (SPLIT, ("--disagg-policy", "isl_or_load")),
    # the same, local prefills kept in the decode pool (before 2026-11-25)
    "cond2p2d-decode-only": (
        SPLIT,
        ("--disagg-policy", "isl_or_load", "--no-disagg-local-on-prefill-workers"),
    ),
}


def prompts(workload: str, seed: int, scale: float) -> tuple[list[str], int, int]:
    """(prompts, output tokens, concurrency); ``scale`` shrinks the request count."""
    rng = random.Random(seed)
    letters = string.ascii_letters + " "
    if workload in ("long", "long50"):  # long50: NVIDIA Dynamo's published shape, 50 out
        n = max(int((48 if workload == "long" else 96) * scale), 8)
        out = 256 if workload == "long" else 50
        return ["".join(rng.choices(letters, k=7936)) for _ in range(n)], out, 8
    heads = ["".join(rng.choices(letters, k=1024)) for _ in range(8)]
    n = max(int(160 * scale), 16)
    return [rng.choice(heads) + "".join(rng.choices(letters, k=64)) for _ in range(n)], 64, 16


def _samples(text: str, name: str, **labels: str) -> list[Sample]:
    """The samples of ``name`` in a Prometheus page whose labels include ``labels``."""
    return [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    ]


def _local_reasons(text: str) -> dict[str, int]:
    """Why requests were prefilled locally: the placements counter's ``reason`` label."""
    out: dict[str, int] = {}
    for s in _samples(text, PLACEMENTS, placement="local"):
        out[s.labels["reason"]] = out.get(s.labels["reason"], 0) + int(s.value)
    return out


def run(config: str, workload: str, args: argparse.Namespace) -> dict[str, object]:
    roles, frontend_args = CONFIGS[config]
    texts, out_tokens, concurrency = prompts(workload, args.seed, args.scale)
    with BenchFleet(
        roles=roles,
        worker_args=("--speedup", str(args.speedup)),
        router="kv",
        frontend_args=frontend_args,
    ) as fleet:
        if args.kill_prefill_after:  # kill -9 every prefill worker mid-run
            victims = [f"worker-{i}" for i, role in enumerate(roles) if role == "prefill"]
            timer = threading.Timer(args.kill_prefill_after, _kill, (fleet, victims))
            timer.daemon = True
            timer.start()
        level: LevelResult
        if args.open_loop_rps:
            level = asyncio.run(open_loop(fleet.url, texts, out_tokens, args.open_loop_rps))
        else:
            level = asyncio.run(
                run_level(
                    fleet.url,
                    "jetfleet-tiny",
                    concurrency,
                    len(texts),
                    0,
                    out_tokens,
                    prompts=texts,
                )
            )
        with urllib.request.urlopen(f"{fleet.url}/metrics", timeout=10) as r:
            metrics = r.read().decode()
    ok = [r for r in level.results if r.ok]
    ttft = [r.ttft_s * 1000 for r in ok]
    itl = [r.itl_s * 1000 for r in ok if r.output_tokens > 1]
    gaps = [g for r in ok for g in r.token_gaps_ms]
    good = [
        r
        for r in ok
        if r.ttft_s * 1000 <= args.ttft_target_ms and r.itl_s * 1000 <= args.itl_target_ms
    ]
    remote = sum(s.value for s in _samples(metrics, PLACEMENTS, placement="remote"))
    local = sum(s.value for s in _samples(metrics, PLACEMENTS, placement="local"))
    transfers = sum(s.value for s in _samples(metrics, f"{TRANSFER}_count"))
    transfer_s = sum(s.value for s in _samples(metrics, f"{TRANSFER}_sum"))
    wall = level.wall_s or 1.0
    return {
        "config": config,
        "workload": workload
        + (f"@{args.open_loop_rps:g}rps" if args.open_loop_rps else "")
        + (f"+kill@{args.kill_prefill_after:g}s" if args.kill_prefill_after else ""),
        "requests": len(level.results),
        "errors": len(level.results) - len(ok),
        "ttft_ms_p50": round(percentile(ttft, 50), 1),
        "ttft_ms_p99": round(percentile(ttft, 99), 1),
        "itl_ms_p50": round(percentile(itl, 50), 2),
        "itl_ms_p99": round(percentile(itl, 99), 2),
        "token_itl_ms_p50": round(percentile(gaps, 50), 2),
        "token_itl_ms_p99": round(percentile(gaps, 99), 2),
        "token_itl_ms_p999": round(percentile(gaps, 99.9), 2),
        "output_tokens_per_s": round(sum(r.output_tokens for r in ok) / wall, 1),
        "requests_per_s": round(len(ok) / wall, 2),
        "goodput_requests_per_s": round(len(good) / wall, 2),
        "prefilled_locally": round(local / (local + remote), 3) if local + remote else 1.0,
        "local_reasons": _local_reasons(metrics),
        "kv_transfer_ms_mean": round(transfer_s / transfers * 1000, 3) if transfers else 0.0,
        "wall_s": round(wall, 1),
    }


def _kill(fleet: BenchFleet, names: list[str]) -> None:
    for name in names:
        child = fleet.group.children.get(name)
        if child is not None:
            child.proc.send_signal(signal.SIGKILL)
    print(f"killed {names}", file=sys.stderr, flush=True)


async def open_loop(url: str, texts: list[str], out_tokens: int, rps: float) -> LevelResult:
    """Requests sent at ``rps``, evenly spaced, whether or not earlier ones finished."""
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    pool = Pool(host, int(port))
    level = LevelResult(0)

    async def one(i: int, text: str) -> None:
        body: dict[str, object] = {
            "model": "jetfleet-tiny",
            "prompt": text,
            "max_tokens": out_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        res: RequestResult = await pool.request(body)
        res.start_index = i
        level.results.append(res)

    tasks = []
    start = time.perf_counter()
    for i, text in enumerate(texts):
        await asyncio.sleep(max(0.0, start + i / rps - time.perf_counter()))
        tasks.append(asyncio.create_task(one(i, text)))
    await asyncio.gather(*tasks)
    level.wall_s = time.perf_counter() - start
    pool.close()
    return level


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="long,short")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--speedup", type=float, default=1.0)
    p.add_argument("--ttft-target-ms", type=float, default=3000.0)
    p.add_argument("--itl-target-ms", type=float, default=25.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=float, default=1.0, help="fraction of the requests (smoke)")
    p.add_argument(
        "--kill-prefill-after", type=float, default=0.0, help="kill -9 the prefill workers (s)"
    )
    p.add_argument(
        "--open-loop-rps", type=float, default=0.0, help="send at this rate instead (open loop)"
    )
    args = p.parse_args(argv)
    configure_logging("warning")
    runs = []
    for workload in args.workloads.split(","):
        for config in args.configs.split(","):
            runs.append(run(config, workload, args))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
