"""A batch beside interactive traffic: does the batch fill the idle capacity and stay out of the
interactive requests' way?

    python -m tests.bench.batch_beside [--workers 4] [--batch-lines 10000] [--load 0.7]
        [--seconds 40]

One ``jetfleet up --no-planner`` (mocker, ``--speedup``) as a user starts it. First its capacity:
the interactive request shape (``--prompt-chars``, ``--output-tokens`` streamed completions) in a
closed loop at ``--capacity-concurrency`` until ``--capacity-requests`` are done (requests/s).
Then two phases of ``--seconds`` each, open loop (arrivals scheduled in advance, TTFT from the
scheduled time) at ``--load`` x capacity: ``alone`` (interactive only), and ``beside`` (the same
arrivals while a batch of ``--batch-lines`` chat completions (``--batch-output-tokens`` each) runs
through the Batch API from the start of the phase). One JSON document: capacity, per phase TTFT
p50/p90/p99 and end-to-end p50/p99 of the interactive requests, their errors, and the batch's
lines answered during the phase (its throughput beside the interactive load) and, after it,
the time it took in all and its request counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import uvloop

from tests.bench.fleet_scale import MODEL, Running, start_up, stop_up
from tests.bench.loadgen import Connection, RequestResult, percentile, random_prompt, run_level


async def capacity(run: Running, args: argparse.Namespace) -> float:
    level = await run_level(
        run.base_url, MODEL, args.capacity_concurrency, args.capacity_requests,
        args.prompt_chars, args.output_tokens, seed=1,
    )  # fmt: skip
    ok = [r for r in level.results if r.ok]
    return len(ok) / level.wall_s


async def open_loop(
    url: str, n: int, rate: float, args: argparse.Namespace, seed: int
) -> list[RequestResult]:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    rng = random.Random(seed)
    prompts = [random_prompt(rng, args.prompt_chars) for _ in range(n)]
    idle: list[Connection] = []
    results: list[RequestResult] = []
    t0 = time.perf_counter() + 0.2
    gaps = [rng.expovariate(rate) for _ in range(n)]  # Poisson arrivals
    at = [t0 + sum(gaps[:i]) for i in range(n)]

    async def one(i: int) -> None:
        await asyncio.sleep(max(at[i] - time.perf_counter(), 0))
        conn = idle.pop() if idle else Connection(host, int(port))
        body = {
            "model": MODEL, "prompt": prompts[i], "max_tokens": args.output_tokens,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
        }  # fmt: skip
        late = time.perf_counter() - at[i]
        try:
            res = await conn.stream_completion("/v1/completions", body)
            idle.append(conn)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            res = RequestResult(False, error=repr(exc))
            conn.close()
        if res.ttft_s:
            res.ttft_s += late
        if res.e2e_s:
            res.e2e_s += late
        results.append(res)

    await asyncio.gather(*(one(i) for i in range(n)))
    for c in idle:
        c.close()
    return results


def figures(results: list[RequestResult]) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    ttft = [r.ttft_s * 1000 for r in ok if r.ttft_s]
    e2e = [r.e2e_s * 1000 for r in ok if r.e2e_s]
    return {
        "requests": len(results),
        "errors": len(results) - len(ok),
        "ttft_p50_ms": round(percentile(ttft, 50), 1),
        "ttft_p90_ms": round(percentile(ttft, 90), 1),
        "ttft_p99_ms": round(percentile(ttft, 99), 1),
        "e2e_p50_ms": round(percentile(e2e, 50), 1),
        "e2e_p99_ms": round(percentile(e2e, 99), 1),
    }


def batch_file(lines: int, output_tokens: int) -> bytes:
    rng = random.Random(7)
    out = []
    for i in range(lines):
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": random_prompt(rng, 200)}],
            "max_tokens": output_tokens,
        }
        line = {"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions"}
        out.append(line | {"body": body})
    return "\n".join(json.dumps(x) for x in out).encode() + b"\n"


async def start_batch(client: httpx.AsyncClient, content: bytes) -> str:
    files = {"file": ("batch.jsonl", content, "application/jsonl")}
    up = await client.post("/files", files=files, data={"purpose": "batch"})
    up.raise_for_status()
    body = {
        "input_file_id": up.json()["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    made = await client.post("/batches", json=body)
    made.raise_for_status()
    return str(made.json()["id"])


async def batch_state(client: httpx.AsyncClient, batch_id: str) -> dict[str, Any]:
    r = await client.get(f"/batches/{batch_id}")
    r.raise_for_status()
    return dict(r.json())


async def measure(run: Running, args: argparse.Namespace) -> dict[str, Any]:
    cap = await capacity(run, args)
    rate = args.load * cap
    n = int(rate * args.seconds)
    print(json.dumps({"capacity_rps": round(cap, 2), "rate": round(rate, 2)}), file=sys.stderr)
    alone = figures(await open_loop(run.base_url, n, rate, args, seed=2))
    print(json.dumps({"phase": "alone", **alone}), file=sys.stderr)
    async with httpx.AsyncClient(base_url=f"{run.base_url}/v1", timeout=120) as client:
        t0 = time.monotonic()
        batch_id = await start_batch(client, batch_file(args.batch_lines, args.batch_output_tokens))
        beside_results = await open_loop(run.base_url, n, rate, args, seed=2)
        during = await batch_state(client, batch_id)
        during_s = time.monotonic() - t0
        beside = figures(beside_results)
        counts = during["request_counts"]
        answered = counts["completed"] + counts["failed"]
        beside |= {
            "batch_lines_answered": answered,
            "batch_lines_per_s": round(answered / during_s, 2),
        }
        print(json.dumps({"phase": "beside", **beside}), file=sys.stderr)
        deadline = time.monotonic() + args.batch_timeout
        state = during
        while (
            state["status"] not in ("completed", "failed", "cancelled")
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(1.0)
            state = await batch_state(client, batch_id)
        total_s = time.monotonic() - t0
    return {
        "capacity_rps": round(cap, 2),
        "interactive_rps": round(rate, 2),
        "alone": alone,
        "beside": beside,
        "ttft_p99_ratio": round(beside["ttft_p99_ms"] / max(alone["ttft_p99_ms"], 1e-9), 3),
        "batch": {
            "lines": args.batch_lines,
            "status": state["status"],
            "request_counts": state["request_counts"],
            "total_s": round(total_s, 1),
            "lines_per_s": round(args.batch_lines / total_s, 2),
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--speedup", type=float, default=10.0)
    p.add_argument("--load", type=float, default=0.7, help="interactive rate, x capacity")
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--prompt-chars", type=int, default=400)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--capacity-concurrency", type=int, default=64)
    p.add_argument("--capacity-requests", type=int, default=1500)
    p.add_argument("--batch-lines", type=int, default=10_000)
    p.add_argument("--batch-output-tokens", type=int, default=32)
    p.add_argument("--batch-timeout", type=float, default=1800.0)
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--workers-per-process", type=int, default=1)
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="batch-beside-"))
    run = start_up(tmp, args.workers, 1, args)
    try:
        result = uvloop.run(measure(run, args))
    finally:
        stop_up(run)
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"benchmark": "batch_beside", "workers": args.workers, **result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
