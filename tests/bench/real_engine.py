"""The fleet's cost over vLLM's real engine, side by side: vLLM's own OpenAI server, jetfleet with
vLLM workers, and NVIDIA Dynamo 1.6.1 with its ``dynamo.vllm`` workers, one system at a time on
this machine, the same model (SmolLM2-135M-Instruct, built by ``infra/vllm_models.py``), the same
engine settings (block 32, eager, prefix caching, 1 GiB of KV) and the same client (the Dynamo
anchor's ``loadgen.py``).

    python -m tests.bench.real_engine overhead [--dynamo-dir /tmp/dynvllm] [--sittings 3]
    python -m tests.bench.real_engine routing  [--dynamo-dir /tmp/dynvllm] [--sittings 3]

``overhead``: one engine, fresh 200-word prompts, 32 streamed tokens, concurrency 1, 4 and 16 (each
system gets one unmeasured level first): req/s, TTFT p50/p99 and CPU seconds per request summed
over every process of the system. ``routing``: two engines, 8 shared 300-word system prompts and
20 fresh words each, concurrency 4: jetfleet's KV router, jetfleet round-robin and Dynamo's KV
router, with the prompt tokens vLLM served from its prefix cache (its own count, in ``usage``).
Dynamo runs from ``--dynamo-dir`` (the anchor of ``../shared/anchors/dynamo-vllm``, installed:
its ``start_dyn.sh`` / ``stop_all.sh``); without it, Dynamo is left out. One JSON line per run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from base.ports import free_port
from tests.support.up import running_up

MODEL_NAME = "SmolLM2-135M-Instruct"  # set by main from --model
SHARED = Path(__file__).resolve().parents[3] / "shared"
# the same engine settings everywhere (float32: what jetfleet picks on this AVX2-only CPU, and
# 2-8x bfloat16's speed here; vLLM's own auto would pick bfloat16)
ENGINE_ARGS = (
    "--block-size", "32", "--enforce-eager", "--max-model-len", "4096", "--dtype", "float32",
)  # fmt: skip
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


@dataclass
class System:
    name: str
    url: str
    pids: dict[str, int]  # process trees that make up the whole system (CPU summed over them)


def _threads(workers: int) -> str:
    return str(max(1, len(os.sched_getaffinity(0)) // workers))


@contextlib.contextmanager
def plain_vllm(model: Path, tmp: Path) -> Iterator[System]:
    """vLLM's own OpenAI server, the engine alone."""
    port = free_port()
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
        "--enable-prefix-caching", "--enable-prompt-tokens-details", *ENGINE_ARGS,
    ]  # fmt: skip
    env = {**os.environ, **CPU_ENV, "OMP_NUM_THREADS": _threads(1)}
    with (tmp / "vllm.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_served(f"http://127.0.0.1:{port}", proc)
        yield System("vllm", f"http://127.0.0.1:{port}", {"vllm": proc.pid})
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(120)


@contextlib.contextmanager
def jetfleet(
    model: Path, tmp: Path, workers: int, router: str, up_args: tuple[str, ...] = ()
) -> Iterator[System]:
    """``jetfleet up --engine vllm`` as a user starts it (KV space and threads: its defaults,
    unless ``up_args`` say otherwise)."""
    tmp.mkdir(parents=True, exist_ok=True)
    extra = ("--engine", "vllm", "--model", str(model), "--router", router, *ENGINE_ARGS, *up_args)
    with running_up(tmp, workers, *extra, start_timeout_s=900) as up:
        name = "jetfleet" if router == "kv" else f"jetfleet-{router}"
        name += "".join(up_args).replace("--", " ") if up_args else ""
        yield System(name, up.base_url, {"up": up.proc.pid})  # servers, fleet and vLLM


@contextlib.contextmanager
def dynamo(directory: Path, model: Path, workers: int) -> Iterator[System]:
    env = {**os.environ, "MODEL": str(model), "SERVED": MODEL_NAME, "DTYPE": "float32"}
    subprocess.run(["bash", "stop_all.sh"], cwd=directory, env=env, check=False)
    started = subprocess.run(
        ["bash", "start_dyn.sh", str(workers), "bench"], cwd=directory, env=env,
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    pids = {
        name: int(pid)
        for name, pid in (
            line.split("=", 1) for line in (directory / "run" / "pids").read_text().split()
        )
    }
    try:
        yield System("dynamo", f"http://127.0.0.1:{env.get('FE_PORT', '8190')}", pids)
    finally:
        subprocess.run(["bash", "stop_all.sh"], cwd=directory, env=env, check=False)


def _wait_served(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 900.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    body = json.dumps({"model": MODEL_NAME, "prompt": "hello", "max_tokens": 2}).encode()
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the server exited during start-up"
        try:
            req = urllib.request.Request(
                f"{url}/v1/completions", body, {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=60) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1.0)
    raise TimeoutError(f"{url} did not serve within {timeout_s} s")


def one_token_words(model: Path, out: Path, limit: int = 4000) -> Path:
    """Words that are one token each (with their leading space) in the model's tokenizer, so
    the load client's "N words" are N prompt tokens."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    words = []
    for piece in sorted(tok.get_vocab()):
        word = piece.removeprefix("Ġ")  # byte-level BPE's space
        plain = piece.startswith("Ġ") and word.isalpha() and word.isascii() and len(word) > 2
        if plain and len(tok.encode(" " + word, add_special_tokens=False).ids) == 1:
            words.append(word)
        if len(words) >= limit:
            break
    if not words:  # a byte-level tokenizer (the tiny model): letters, two tokens with the space
        words = list("abcdefghijklmnopqrstuvwxyz")
    out.write_text("\n".join(words) + "\n")
    return out


def load(
    system: System,
    workload: list[str],
    concurrency: int,
    requests: int,
    seed: int,
    words: Path,
) -> dict[str, Any]:
    """One closed-loop run of the anchor's load client (after ``concurrency`` unmeasured
    requests), reduced to what the comparison needs."""
    with tempfile.TemporaryDirectory() as out:
        argv = [
            sys.executable, str(SHARED / "anchors" / "dynamo" / "loadgen.py"), "--url", system.url,
            "--model", MODEL_NAME, "--words", str(words),
            *workload, "--concurrency", str(concurrency), "--requests", str(requests),
            "--warmup", str(concurrency), "--seed", str(seed), "--max-seconds", "900",
            "--request-timeout", "600", "--out", out,
            *(f"--pid={name}={pid}" for name, pid in system.pids.items()),
        ]  # fmt: skip
        subprocess.run(argv, check=True, capture_output=True)
        d = json.loads((Path(out) / "summary.json").read_text())
    ok = max(int(d["requests_ok"]), 1)
    cpu_s = sum(d["cpu_pct_of_one_core"].values()) / 100.0 * float(d["wall_s"])
    prompt = float(d["mean_prompt_tokens"] or 0.0)
    cached = d["cached_tokens"]
    return {
        "system": system.name,
        "concurrency": concurrency,
        "requests": d["requests_ok"],
        "errors": d["errors"],
        "req_per_s": round(d["req_per_s"], 2),
        "ttft_ms_p50": round(d["ttft_ms"]["p50"], 1),
        "ttft_ms_p99": round(d["ttft_ms"]["p99"], 1),
        "cpu_ms_per_request": round(1000 * cpu_s / ok, 1),
        "mean_prompt_tokens": round(prompt, 1),
        "cached_fraction": round((cached["mean"] or 0.0) / prompt, 3) if prompt else None,
    }


OVERHEAD = ["--workload", "fixed", "--prompt-tokens", "200", "--max-tokens", "32"]
ROUTING = [
    "--workload", "shared-prefix", "--num-prefixes", "8", "--prefix-tokens", "300",
    "--unique-tokens", "20", "--max-tokens", "32",
]  # fmt: skip


def overhead(
    model: Path, tmp: Path, dynamo_dir: Path | None, seed: int, words: Path, up_args: list[str]
) -> None:
    starts: list[tuple[str, Any]] = [
        ("vllm", lambda: plain_vllm(model, tmp)),
        ("jetfleet", lambda: jetfleet(model, tmp / f"up-{seed}", 1, "kv")),
    ]
    if up_args:  # the same fleet with other flags, beside its defaults
        variant = tuple(up_args)
        starts.append(("jetfleet", lambda: jetfleet(model, tmp / f"up2-{seed}", 1, "kv", variant)))
    if dynamo_dir is not None:
        starts.append(("dynamo", lambda: dynamo(dynamo_dir, model, 1)))
    for _name, start in starts:
        with start() as system:
            load(system, OVERHEAD, 1, 8, seed, words)  # the first seconds after a start run slow
            for c in (1, 4, 16):  # fresh prompts at every level: a seed of its own
                row = load(system, OVERHEAD, c, max(24, 6 * c), seed * 100 + c, words)
                print(json.dumps({"bench": "overhead", **row}), flush=True)


def routing(
    model: Path, tmp: Path, dynamo_dir: Path | None, seed: int, words: Path, up_args: list[str]
) -> None:
    starts: list[tuple[str, Any]] = [
        ("jetfleet", lambda: jetfleet(model, tmp / f"kv-{seed}", 2, "kv")),
        ("jetfleet-rr", lambda: jetfleet(model, tmp / f"rr-{seed}", 2, "round-robin")),
    ]
    if dynamo_dir is not None:
        starts.append(("dynamo", lambda: dynamo(dynamo_dir, model, 2)))
    for _name, start in starts:
        with start() as system:
            print(
                json.dumps({"bench": "routing", **load(system, ROUTING, 4, 96, seed, words)}),
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", choices=["overhead", "routing"])
    ap.add_argument("--dynamo-dir", type=Path, default=None)
    ap.add_argument("--sittings", type=int, default=1)
    ap.add_argument(
        "--variant", action="append", default=[], metavar="UP_FLAG",
        help="overhead: also run jetfleet with these up flags (repeat; e.g. --variant=--cpu-threads"
        " --variant=1)",
    )  # fmt: skip
    ap.add_argument(
        "--model", choices=["smollm2", "tiny-llama"], default="smollm2",
        help="smollm2: a real model; tiny-llama: 2 layers, where the fleet's own cost shows",
    )  # fmt: skip
    args = ap.parse_args()
    from infra.vllm_models import MODELS, ensure

    global MODEL_NAME
    MODEL_NAME = MODELS[args.model].name
    model = ensure(args.model)
    with tempfile.TemporaryDirectory(prefix="real-engine-") as tmp:
        words = one_token_words(model, Path(tmp) / "words.txt")
        for sitting in range(args.sittings):
            (overhead if args.bench == "overhead" else routing)(
                model, Path(tmp), args.dynamo_dir, 100 + sitting, words, args.variant
            )


if __name__ == "__main__":
    main()
