"""A batch beside interactive traffic: does the batch fill the idle capacity and stay out of the
interactive requests' way?

    python -m tests.bench.batch_beside [--workers 2] [--speedup 1] [--batch-lines 10000]
        [--load 0.7] [--seconds 30]

One ``jetfleet up --no-planner`` (mocker, ``--speedup``) as a user starts it. By default the
engines are the limit (speedup 1: the mocker's steps take what a GPU's would), as in a GPU fleet;
``--workers 4 --speedup 10`` makes the fleet's own CPU the limit on a small machine instead
(each phase reports ``machine_cpu_share``: the fleet's and the client's CPU over the cores).
First its capacity:
the interactive request shape (``--prompt-chars``, ``--output-tokens`` streamed completions) in a
closed loop at ``--capacity-concurrency`` until ``--capacity-requests`` are done (requests/s).
Then ``--sittings`` pairs of phases of ``--seconds`` each, open loop (arrivals scheduled in
advance, TTFT from the scheduled time) at ``--load`` x capacity: ``alone`` (interactive only), and
``beside`` (the same arrivals while a batch of ``--batch-lines`` chat completions
(``--batch-output-tokens`` each) runs through the Batch API from the start of the phase; it is
cancelled after the phase, but in the last sitting, where it runs to its end). One JSON document:
capacity; the TTFT p50/p90/p99 and end-to-end p50/p99 of the interactive requests of all the
sittings pooled, per kind of phase, and each sitting's own; the batch's lines answered during
the phases (its throughput beside the interactive load); the last batch's time in all and its
request counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import uvloop

from tests.bench.fleet_scale import MODEL, Running, cpu_by_kind, start_up, stop_up
from tests.bench.loadgen import Connection, RequestResult, percentile, random_prompt, run_level
from tests.bench.procstat import cpu_seconds


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


class CpuClock:
    """The fleet's and this client's CPU over a phase, as a share of the machine's cores: above
    ~0.85 the phase is CPU-bound, and any added work (a batch) queues the interactive requests."""

    def __init__(self, run: Running) -> None:
        self.root = run.proc.pid
        self.cores = os.cpu_count() or 1
        self.t0, self.cpu0 = time.monotonic(), self._cpu()

    def _cpu(self) -> float:
        return sum(cpu_by_kind(self.root).values()) + cpu_seconds(os.getpid())

    def share(self) -> float:
        wall = time.monotonic() - self.t0
        return round((self._cpu() - self.cpu0) / (wall * self.cores), 3)


async def wait_ended(client: httpx.AsyncClient, batch_id: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    state = await batch_state(client, batch_id)
    while state["status"] not in ("completed", "failed", "cancelled"):
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(1.0)
        state = await batch_state(client, batch_id)
    return state


async def sitting(
    run: Running, client: httpx.AsyncClient, args: argparse.Namespace, rate: float, i: int
) -> tuple[list[RequestResult], list[RequestResult], dict[str, Any]]:
    """Interactive alone, then the same arrivals beside a new batch; the batch is cancelled
    after the phase, but in the last sitting, where it runs to the end."""
    n = int(rate * args.seconds)
    clock = CpuClock(run)
    alone = await open_loop(run.base_url, n, rate, args, seed=2 + i)
    report: dict[str, Any] = {"sitting": i + 1, "alone": figures(alone)}
    report["alone"]["machine_cpu_share"] = clock.share()
    t0 = time.monotonic()
    clock = CpuClock(run)
    batch_id = await start_batch(client, batch_file(args.batch_lines, args.batch_output_tokens))
    beside = await open_loop(run.base_url, n, rate, args, seed=2 + i)
    during = await batch_state(client, batch_id)
    during_s = time.monotonic() - t0
    counts = during["request_counts"]
    answered = counts["completed"] + counts["failed"]
    report["beside"] = figures(beside) | {
        "machine_cpu_share": clock.share(),
        "batch_lines_answered": answered,
        "batch_lines_per_s": round(answered / during_s, 2),
    }
    print(json.dumps(report), file=sys.stderr)
    last = i == args.sittings - 1
    if not last:
        (await client.post(f"/batches/{batch_id}/cancel")).raise_for_status()
    state = await wait_ended(client, batch_id, args.batch_timeout)
    if last:
        total_s = time.monotonic() - t0
        report["batch"] = {
            "lines": args.batch_lines,
            "status": state["status"],
            "request_counts": state["request_counts"],
            "total_s": round(total_s, 1),
            "lines_per_s": round(args.batch_lines / total_s, 2),
        }
    return alone, beside, report


async def measure(run: Running, args: argparse.Namespace) -> dict[str, Any]:
    cap = await capacity(run, args)
    rate = args.load * cap
    print(json.dumps({"capacity_rps": round(cap, 2), "rate": round(rate, 2)}), file=sys.stderr)
    alone: list[RequestResult] = []
    beside: list[RequestResult] = []
    sittings = []
    async with httpx.AsyncClient(base_url=f"{run.base_url}/v1", timeout=120) as client:
        for i in range(args.sittings):
            a, b, report = await sitting(run, client, args, rate, i)
            alone += a
            beside += b
            sittings.append(report)
    pooled_alone, pooled_beside = figures(alone), figures(beside)
    lines = [s["beside"]["batch_lines_per_s"] for s in sittings]
    return {
        "capacity_rps": round(cap, 2),
        "interactive_rps": round(rate, 2),
        "alone": pooled_alone,
        "beside": pooled_beside | {"batch_lines_per_s": round(sum(lines) / len(lines), 2)},
        "ttft_p99_ratio": round(
            pooled_beside["ttft_p99_ms"] / max(pooled_alone["ttft_p99_ms"], 1e-9), 3
        ),
        "batch": sittings[-1]["batch"],
        "sittings": sittings,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--speedup", type=float, default=1.0, help="1: engine-bound, as on GPUs")
    p.add_argument("--load", type=float, default=0.7, help="interactive rate, x capacity")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--sittings", type=int, default=3, help="alone/beside pairs, pooled")
    p.add_argument("--prompt-chars", type=int, default=400)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--capacity-concurrency", type=int, default=64)
    p.add_argument("--capacity-requests", type=int, default=600)
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
