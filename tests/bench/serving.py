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
import json
import sys
import tempfile
import urllib.request
from pathlib import Path

from infra.embedded import EmbeddedNats
from infra.logs import configure_logging
from infra.supervisor import ProcessGroup, cli_command, wait_http_ok
from tests.bench.loadgen import run_level, summarize
from tests.bench.procstat import CpuMeter
from tests.e2e.fleet import free_port


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


def start_fleet(
    args: argparse.Namespace, tmp: Path
) -> tuple[EmbeddedNats, ProcessGroup, str, dict[str, int]]:
    nats = EmbeddedNats(tmp / "nats", port=0)
    nats.start()
    group = ProcessGroup(tmp / "logs")
    common = ["--nats", nats.url, "--log-level", "warning"]
    for i in range(args.workers):
        group.start(
            f"worker-{i}",
            cli_command(
                "worker",
                *common,
                "--speedup",
                str(args.speedup),
                "--max-num-seqs",
                "256",
                "--flush-interval-ms",
                str(args.flush_interval_ms),
            ),
        )
    port = free_port()
    group.start(
        "frontend",
        cli_command(
            "frontend",
            *common,
            "--port",
            str(port),
            "--router",
            args.router,
            "--max-waiting-per-worker",
            "100000",
        ),
    )
    url = f"http://127.0.0.1:{port}"
    wait_http_ok(f"{url}/ready", 60, group)
    pids = {name: c.proc.pid for name, c in group.children.items()}
    pids["nats-server"] = nats.pid
    return nats, group, url, pids


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
    with tempfile.TemporaryDirectory(prefix="jetfleet-bench-") as tmp:
        nats = group = None
        pids: dict[str, int] = {}
        url = args.url
        try:
            if url is None:
                nats, group, url, pids = start_fleet(args, Path(tmp))
            warm_up(url, args.model)
            out = []
            for c in levels:
                n = args.requests or max(100, 40 * c)
                meter = CpuMeter(pids)
                meter.start()
                level = asyncio.run(
                    run_level(url, args.model, c, n, args.prompt_tokens, args.output_tokens, seed=c)
                )
                cpu = meter.stop()
                row = summarize(level)
                row["cpu_s"] = cpu
                row["cpu_s_per_request"] = {
                    k: round(v / max(row["requests"], 1) * 1000, 3) for k, v in cpu.items()
                }  # milliseconds of CPU per request, per process
                errors = [r.error for r in level.results if not r.ok][:3]
                if errors:
                    row["error_samples"] = errors
                out.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
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
        finally:
            if group is not None:
                group.stop_all(timeout_s=20)
            if nats is not None:
                nats.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
