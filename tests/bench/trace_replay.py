"""Open-loop replay of a production trace: requests arrive at the trace's own times (ticks of
several at once, idle gaps), not when a slot frees; long raw prompts sharing prefixes, sent as
text to ``/v1/completions`` (no chat template: no message-level prompt cache helps).

    python -m tests.bench.trace_replay --trace conversation_trace.jsonl --model-dir DIR \\
        --words DIR/words.txt [--seconds 300] [--speed 1]
    python -m tests.bench.trace_replay --trace ... --url http://127.0.0.1:8000 --model NAME \\
        --pid frontend=PID ...          # a system already running (NVIDIA Dynamo's anchor)

The trace is Mooncake's format (``github.com/kvcache-ai/Mooncake``, ``FAST25-release/traces``,
e.g. ``conversation_trace.jsonl``): one JSON object a line with ``timestamp`` (ms since the first
request), ``input_length``, ``output_length`` and ``hash_ids``, one id per 512-token block (equal
ids: equal blocks). Each id becomes 512 words drawn by a generator seeded with the id, from
``--words`` (one token each in the anchor's model), so requests sharing ids share their prefix
token for token; a request's last block is cut to its ``input_length``. ``--seconds`` takes the
trace's first seconds (300: 927 requests, 13.5k tokens on average, up to 122k).

Without ``--url`` it starts a private fleet: ``--workers`` (4) mocker workers at speedup 1 with
blocks of 64 tokens (the anchor's), the KV router, the indexer and one frontend. It prints one
JSON document: TTFT p50/p90/p99, ITL, errors, the fraction of prompt tokens served from cache,
and CPU seconds per process over the run.
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

from tests.bench.fleetctl import BenchFleet
from tests.bench.loadgen import LevelResult, stream_once, summarize
from tests.bench.procstat import CpuMeter

BLOCK_TOKENS = 512  # the trace's block


@dataclass(frozen=True)
class TraceRequest:
    at_s: float  # arrival, seconds after the first request
    prompt: str
    output_tokens: int


def load_trace(
    path: Path,
    seconds: float,
    words: list[str],
    speed: float,
    *,
    start_s: float = 0.0,
    block_tokens: int = BLOCK_TOKENS,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
    keep_one_in: int = 1,
) -> list[TraceRequest]:
    """The trace's requests from ``start_s`` to ``start_s + seconds`` (times from the slice's
    start, divided by ``speed``). ``block_tokens`` below the trace's 512 scales the whole shape
    down (a model of short context): each block is that many words, and the input and output
    lengths shrink by the same factor (at least one token), so requests still share the same
    blocks; ``max_*`` cut what is still too long (a prompt keeps its leading blocks).
    ``keep_one_in`` N > 1 keeps one conversation in N, every turn of it (a conversation is known
    by its second block: the first opens every request of Mooncake's conversation trace), so a
    long slice arrives at a rate a small machine serves with its reuse between turns intact."""
    scale = block_tokens / BLOCK_TOKENS
    blocks: dict[int, list[str]] = {}

    def block(hash_id: int) -> list[str]:
        if hash_id not in blocks:
            rng = random.Random(hash_id)
            blocks[hash_id] = [rng.choice(words) for _ in range(block_tokens)]
        return blocks[hash_id]

    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        at_s = row["timestamp"] / 1000.0 - start_s
        if at_s < 0:
            continue
        if at_s > seconds:
            break
        hashes = row["hash_ids"]
        if keep_one_in > 1 and hashes[min(1, len(hashes) - 1)] % keep_one_in:
            continue
        n_in = max(1, round(row["input_length"] * scale))
        if max_prompt_tokens is not None:
            n_in = min(n_in, max_prompt_tokens)
        n_out = max(1, round(row["output_length"] * scale))
        if max_output_tokens is not None:
            n_out = min(n_out, max_output_tokens)
        tokens = [w for h in hashes for w in block(h)][:n_in]
        out.append(TraceRequest(at_s / speed, " ".join(tokens), n_out))
    return out


async def replay(url: str, model: str, requests: list[TraceRequest]) -> LevelResult:
    """Each request at its time on its own connection, whatever is still running."""
    host, port = url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)
    level = LevelResult(concurrency=0)

    async def one(index: int, req: TraceRequest) -> None:
        body: dict[str, object] = {
            "model": model,
            "prompt": req.prompt,
            "max_tokens": req.output_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        res = await stream_once(host, int(port), body)
        res.start_index = index
        level.results.append(res)

    start = time.perf_counter()
    tasks = []
    for i, req in enumerate(requests):
        await asyncio.sleep(max(0.0, start + req.at_s - time.perf_counter()))
        tasks.append(asyncio.create_task(one(i, req)))
    await asyncio.gather(*tasks)
    level.wall_s = time.perf_counter() - start
    return level


def measure(
    url: str,
    model: str,
    requests: list[TraceRequest],
    pids: dict[str, int],
    dump: Path | None = None,
) -> dict[str, Any]:
    meter = CpuMeter(pids)
    meter.start()
    level = asyncio.run(replay(url, model, requests))
    cpu = meter.stop()
    if dump is not None:
        write_requests(dump, requests, level)
    row: dict[str, Any] = summarize(level)
    row.pop("concurrency")
    ok = [r for r in level.results if r.ok]
    row["cached_fraction"] = round(
        sum(r.cached_tokens for r in ok) / max(1, sum(r.prompt_tokens for r in ok)), 4
    )
    row["cpu_s"] = cpu
    fleet_cpu = sum(s for name, s in cpu.items() if name != "load_client")
    row["cpu_ms_per_request"] = round(1000 * fleet_cpu / max(1, len(ok)), 2)
    errors = [r.error for r in level.results if not r.ok][:3]
    if errors:
        row["first_errors"] = errors
    return row


def write_requests(path: Path, requests: list[TraceRequest], level: LevelResult) -> None:
    """One JSON line a request, in the trace's order: when it arrived, its prompt and output
    lengths, what the server said was cached, its TTFT and end-to-end time (to compare two
    systems request by request: which prompts make the tail)."""
    rows = []
    for res in sorted(level.results, key=lambda r: r.start_index):
        req = requests[res.start_index]
        row = {"index": res.start_index, "at_s": round(req.at_s, 3), "ok": res.ok}
        row |= {"prompt_tokens": res.prompt_tokens, "cached_tokens": res.cached_tokens}
        row |= {"output_tokens": res.output_tokens, "ttft_ms": round(1000 * res.ttft_s, 2)}
        row |= {"e2e_ms": round(1000 * res.e2e_s, 2)}
        rows.append(json.dumps(row))
    path.write_text("\n".join(rows) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=300.0, help="seconds of the trace")
    ap.add_argument("--start", type=float, default=0.0, help="the slice's start in the trace, s")
    ap.add_argument(
        "--max-prompt-tokens", type=int, default=None, help="cut longer prompts (the context)"
    )
    ap.add_argument("--speed", type=float, default=1.0, help="arrivals this many times faster")
    ap.add_argument("--words", type=Path, required=True, help="one-token words, one per line")
    ap.add_argument("--model-dir", default=None, help="the model a private fleet serves")
    ap.add_argument("--model", default=None, help="served model name (default: the dir's name)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--frontend-arg", action="append", default=[], help="passed to the frontend")
    ap.add_argument("--url", default=None, help="measure a running system at this base URL")
    ap.add_argument("--pid", action="append", default=[], help="name=PID of a process to meter")
    ap.add_argument("--label", default="jetfleet")
    ap.add_argument("--dump", type=Path, default=None, help="write one JSON line a request here")
    args = ap.parse_args(argv)
    words = args.words.read_text().split()
    requests = load_trace(
        args.trace,
        args.seconds,
        words,
        args.speed,
        start_s=args.start,
        max_prompt_tokens=args.max_prompt_tokens,
    )
    head = {"label": args.label, "trace": args.trace.name, "start_s": args.start}
    head |= {"seconds": args.seconds}
    head |= {"requests_in_trace": len(requests), "speed": args.speed}
    if args.url:
        pids = dict(item.split("=", 1) for item in args.pid)
        pids_by_name = {k: int(v) for k, v in pids.items()}
        row = measure(args.url, args.model, requests, pids_by_name, args.dump)
    else:
        model = args.model or Path(args.model_dir).name
        worker_args = (
            "--model", args.model_dir, "--served-model-name", model, "--speedup", "1",
            "--block-size", str(args.block_size),
        )  # fmt: skip
        with BenchFleet(
            workers=args.workers,
            worker_args=worker_args,
            router="kv",
            frontend_args=tuple(args.frontend_arg),
        ) as fleet:
            row = measure(fleet.url, model, requests, fleet.pids, args.dump)
    print(json.dumps(head | row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
