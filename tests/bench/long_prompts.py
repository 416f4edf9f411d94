"""Long prompts through the frontend: fresh 16k-token prompts, and repeated 12k-token heads.

    python -m tests.bench.long_prompts --model-dir DIR --words DIR/words.txt
    python -m tests.bench.long_prompts --frontends 1,2 --workloads fresh,prefix
    python -m tests.bench.long_prompts --url http://127.0.0.1:8000 --model NAME --pid frontend=PID

Per frontend count (``--frontends``, processes on one port) it starts a private fleet: 4 mocker
workers at speedup 1 (blocks of 64 tokens), an indexer and a kv-routed frontend. Then, closed
loop with the lean client (``loadgen.py``):

- ``fresh``: every request a new prompt of ``--prompt-tokens`` (16,384) tokens, concurrency 12;
- ``prefix``: ``--heads`` (4) conversation heads of ``--head-tokens`` (12,288) tokens as the system
  message, each request one head plus ``--fresh-tokens`` (256) new tokens as the user message
  (chat: the frontend's prefix cache works on messages).

It prints one JSON document: per run TTFT p50/p90/p99, errors, requests/s, the frontend's CPU (all
its processes) per request and per 1k prompt tokens, and the whole system's (``cpu_ms_per_request``:
every metered process summed; jetfleet's fleet: workers, frontend, indexer, NATS and Redis).
``--url`` with ``--pid`` (repeatable) measures an already running system the same way (NVIDIA
Dynamo started by ``../shared/anchors/dynamo``: its frontend and every mocker).

Prompts are words from ``--words`` (one token each in the anchor's model dir, which has the
vocabulary for it); without ``--words``, random letters on the shipped byte-level model (a token a
character) with its context raised to 131,072.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

from base.logs import configure_logging
from model.card import default_model_dir
from tests.bench.fleetctl import BenchFleet
from tests.bench.loadgen import random_prompt, run_level, summarize
from tests.bench.procstat import CpuMeter
from tests.bench.serving import warm_up


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--model", default=None, help="served model name (default: the dir's name)")
    ap.add_argument("--words", default=None, help="one-token words, one per line")
    ap.add_argument("--frontends", default="1,2", help="frontend processes per run")
    ap.add_argument("--workloads", default="fresh,prefix")
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--concurrency", type=int, default=12)
    ap.add_argument("--prompt-tokens", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-tokens", type=int, default=12288)
    ap.add_argument("--fresh-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--speedup", type=float, default=1.0)
    ap.add_argument("--url", default=None, help="measure a running system at this base URL")
    ap.add_argument("--pid", action="append", default=[], help="name=PID of a process to meter")
    ap.add_argument("--seed", type=int, default=1)
    return ap.parse_args(argv)


def long_context_copy(tmp: Path) -> Path:
    """The shipped tiny model with its context raised for long prompts."""
    out = tmp / "jetfleet-tiny-long"
    shutil.copytree(default_model_dir(), out)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["max_position_embeddings"] = 131072
    cfg_path.write_text(json.dumps(cfg))
    return out


class Prompts:
    def __init__(self, words_file: str | None, seed: int) -> None:
        self.rng = random.Random(seed)
        self.words = Path(words_file).read_text().split() if words_file else None

    def text(self, tokens: int) -> str:
        if self.words is None:
            return random_prompt(self.rng, tokens)
        return " ".join(self.rng.choice(self.words) for _ in range(tokens))


def workload(name: str, args: argparse.Namespace, prompts: Prompts) -> list[list[dict[str, str]]]:
    if name == "fresh":
        return [
            [{"role": "user", "content": prompts.text(args.prompt_tokens)}]
            for _ in range(args.requests)
        ]
    heads = [prompts.text(args.head_tokens) for _ in range(args.heads)]
    return [
        [
            {"role": "system", "content": prompts.rng.choice(heads)},
            {"role": "user", "content": prompts.text(args.fresh_tokens)},
        ]
        for _ in range(args.requests)
    ]


def measure(
    url: str, model: str, name: str, args: argparse.Namespace, pids: dict[str, int]
) -> dict[str, object]:
    prompts = Prompts(args.words, args.seed)
    items = workload(name, args, prompts)
    warm = workload(name, argparse.Namespace(**{**vars(args), "requests": 4}), prompts)
    asyncio.run(run_level(url, model, 4, 4, 0, args.output_tokens, prompts=warm))
    meter = CpuMeter(pids)
    meter.start()
    level = asyncio.run(
        run_level(url, model, args.concurrency, len(items), 0, args.output_tokens, prompts=items)
    )
    cpu = meter.stop()
    row: dict[str, object] = {"workload": name, **summarize(level)}
    fe = cpu.get("frontend")
    ok = max(1, len([r for r in level.results if r.ok]))
    prompt_tokens = int(row["prompt_tokens"])  # type: ignore[call-overload]
    if fe is not None:
        row["frontend_cpu_s"] = fe
        row["frontend_cpu_ms_per_request"] = round(fe * 1000 / ok, 2)
        row["frontend_cpu_ms_per_1k_prompt_tokens"] = round(fe * 1e6 / max(1, prompt_tokens), 3)
    system = sum(v for k, v in cpu.items() if k != "load_client")
    if pids:  # every process of the system, summed: what a request costs the machine
        row["cpu_ms_per_request"] = round(system * 1000 / ok, 2)
        row["cpu_ms_per_1k_prompt_tokens"] = round(system * 1e6 / max(1, prompt_tokens), 3)
    row["cpu_s"] = cpu
    errors = [r.error for r in level.results if not r.ok][:3]
    if errors:
        row["first_errors"] = errors
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging("warning", "console")
    workloads = [w for w in args.workloads.split(",") if w]
    runs: list[dict[str, object]] = []
    if args.url:
        pids = {k: int(v) for k, v in (p.split("=", 1) for p in args.pid)}
        model = args.model or "anchor-model"
        for name in workloads:
            runs.append({"system": "external", **measure(args.url, model, name, args, pids)})
    else:
        with tempfile.TemporaryDirectory(prefix="jetfleet-long-") as tmp:
            model_dir = Path(args.model_dir) if args.model_dir else long_context_copy(Path(tmp))
            model = args.model or model_dir.resolve().name
            worker_args = (
                "--model", str(model_dir), "--served-model-name", model,
                "--speedup", str(args.speedup), "--block-size", "64",
                "--num-gpu-blocks", "16384",
            )  # fmt: skip
            for n in (int(x) for x in args.frontends.split(",") if x):
                with BenchFleet(
                    workers=args.workers,
                    worker_args=worker_args,
                    router="kv",
                    frontend_args=("--processes", str(n)),
                ) as fleet:
                    warm_up(fleet.url, model)
                    for name in workloads:
                        row = measure(fleet.url, model, name, args, fleet.pids)
                        runs.append({"system": f"jetfleet-{n}-frontend", **row})
    print(json.dumps({"benchmark": "long_prompts", "args": vars(args), "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
