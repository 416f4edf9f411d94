"""Scale out under a queue: does a worker that joins take the requests already waiting?

    python -m tests.bench.scale_out [--seconds 20] [--load 1.5] [--join-at 4] [--sittings 3]
        [--max-num-seqs 8] [--output-tokens 64] [--hold 8]

One ``jetfleet up --no-planner --workers 1`` (mocker at speedup 1, ``--max-num-seqs`` slots: the
engine is the limit, as a GPU's is) as a user starts it, measured first for its capacity (closed
loop at twice its slots, requests/s). Then open-loop arrivals (Poisson, TTFT from the scheduled
time) at ``--load`` x that capacity for ``--seconds``: the one worker falls behind and a queue
grows. ``--join-at`` seconds in, a second worker starts, as the planner would start one for that
queue. Each sitting runs the fleet twice, in turn: frontends holding requests once every worker
has ``--hold`` waiting (the default) and not holding (``--hold-waiting-per-worker 0``, every
request sent on to wait on a worker). One JSON document: per run, TTFT p50/p90/p99 and
end-to-end p50/p99 of all the requests and of those that arrived before the second worker
started, the errors by kind (a 503 is a request shed), and how long after the last arrival the
last request ended (the queue's drain); the medians over the sittings per setting. Each run's
line also goes to stderr as it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import uvloop

from base.ports import free_port
from infra.command import cli_command
from tests.bench.batch_beside import figures as latency_figures
from tests.bench.fleet_scale import MODEL, UP_LINE, Running, stop_up
from tests.bench.loadgen import RequestResult, random_prompt, run_level, stream_once


def start(tmp: Path, hold: int, args: argparse.Namespace) -> Running:
    port = free_port()
    argv = cli_command(
        "up", "--port", str(port), "--nats-port", "0", "--redis-port", "0",
        "--state-dir", str(tmp / "state"), "--no-planner", "--router", "kv", "--workers", "1",
        "--speedup", "1", "--max-num-seqs", str(args.max_num_seqs),
        "--hold-waiting-per-worker", str(hold), "--log-level", "warning",
    )  # fmt: skip
    log = tmp / "up.log"
    t0 = time.monotonic()
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    while not (found := UP_LINE.search(log.read_text(errors="replace"))):
        if proc.poll() is not None or time.monotonic() - t0 > 120:
            raise RuntimeError(f"jetfleet up did not come up:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return Running(proc, f"http://127.0.0.1:{port}", found.group(1), found.group(2), log, t0)


def second_worker(run: Running, tmp: Path, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    argv = cli_command(
        "worker", "--nats", run.nats_url, "--worker-id", "joined", "--speedup", "1",
        "--max-num-seqs", str(args.max_num_seqs), "--log-level", "warning",
    )  # fmt: skip
    with (tmp / "joined.log").open("wb") as sink:
        return subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)


async def open_loop(
    run: Running, tmp: Path, rate: float, args: argparse.Namespace, seed: int
) -> tuple[list[tuple[float, RequestResult]], float, subprocess.Popen[bytes] | None]:
    """(arrival s from the start, result) per request, the last end, and the joined worker."""
    host, port = run.base_url.split("://", 1)[1].rsplit(":", 1)
    rng = random.Random(seed)
    n = max(int(rate * args.seconds), 1)
    prompts = [random_prompt(rng, args.prompt_chars) for _ in range(n)]
    t0 = time.perf_counter() + 0.2
    at, clock = [], t0
    for _ in range(n):
        clock += rng.expovariate(rate)
        at.append(clock)
    out: list[tuple[float, RequestResult]] = []
    last_end = 0.0
    joined: list[subprocess.Popen[bytes]] = []

    async def join() -> None:
        await asyncio.sleep(max(t0 + args.join_at - time.perf_counter(), 0))
        joined.append(second_worker(run, tmp, args))

    async def one(i: int) -> None:
        nonlocal last_end
        await asyncio.sleep(max(at[i] - time.perf_counter(), 0))
        body: dict[str, object] = {
            "model": MODEL, "prompt": prompts[i], "max_tokens": args.output_tokens,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
        }  # fmt: skip
        late = time.perf_counter() - at[i]
        res = await stream_once(host, int(port), body)
        if res.ttft_s:
            res.ttft_s += late
        if res.e2e_s:
            res.e2e_s += late
        last_end = max(last_end, time.perf_counter() - t0)
        out.append((at[i] - t0, res))

    await asyncio.gather(join(), *(one(i) for i in range(n)))
    return out, last_end - (at[-1] - t0), joined[0] if joined else None


def figures(results: list[RequestResult]) -> dict[str, Any]:
    """``batch_beside``'s figures, and the errors by kind (a 503 is a request shed)."""
    kinds = Counter(r.error.split(":", 1)[0][:60] for r in results if not r.ok)
    return {**latency_figures(results), "error_kinds": dict(kinds)}


async def one_run(hold: int, args: argparse.Namespace, sitting: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="jf-scale-out-"))
    run = start(tmp, hold, args)
    joined: subprocess.Popen[bytes] | None = None
    try:
        level = await run_level(
            run.base_url, MODEL, 2 * args.max_num_seqs, 8 * args.max_num_seqs,
            args.prompt_chars, args.output_tokens, seed=1,
        )  # fmt: skip
        capacity = sum(r.ok for r in level.results) / level.wall_s
        rate = args.load * capacity
        results, drain_s, joined = await open_loop(run, tmp, rate, args, seed=sitting)
        before = [r for a, r in results if a < args.join_at]
        return {
            "bench": "scale_out",
            "hold_waiting_per_worker": hold,
            "sitting": sitting,
            "capacity_rps": round(capacity, 2),
            "rate_rps": round(rate, 2),
            "join_at_s": args.join_at,
            "drain_s": round(drain_s, 2),
            "all": figures([r for _a, r in results]),
            "arrived_before_join": figures(before),
        }
    finally:
        if joined is not None:
            joined.terminate()
            joined.wait(60)
        stop_up(run)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--load", type=float, default=1.5, help="x the one worker's capacity")
    ap.add_argument("--join-at", type=float, default=4.0, help="s after the first arrival")
    ap.add_argument("--sittings", type=int, default=3)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--prompt-chars", type=int, default=400)
    ap.add_argument("--hold", type=int, default=8, help="--hold-waiting-per-worker when holding")
    args = ap.parse_args()
    runs: list[dict[str, Any]] = []
    for sitting in range(1, args.sittings + 1):
        for hold in (args.hold, 0):
            line = uvloop.run(one_run(hold, args, sitting))
            print(json.dumps(line), file=sys.stderr, flush=True)  # progress
            runs.append(line)
    medians: list[dict[str, Any]] = []
    for hold in (args.hold, 0):
        mine = [r for r in runs if r["hold_waiting_per_worker"] == hold]
        summary: dict[str, Any] = {"hold_waiting_per_worker": hold}
        summary["drain_s"] = statistics.median(r["drain_s"] for r in mine)
        summary["errors"] = sum(r["all"]["errors"] for r in mine)
        for part in ("all", "arrived_before_join"):
            for key in ("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms"):
                summary[f"{part}_{key}"] = statistics.median(r[part][key] for r in mine)
        medians.append(summary)
    print(json.dumps({"bench": "scale_out", "medians": medians, "runs": runs}))


if __name__ == "__main__":
    sys.exit(main())
