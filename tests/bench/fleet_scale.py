"""The whole fleet at scale: ``jetfleet up`` as a user starts it, with 16 to 1,024 workers and 1
to 8 frontends, at a fixed request rate.

    python -m tests.bench.fleet_scale [--configs 16x1,1024x1,1024x8] [--rate 40] [--seconds 30]

Each configuration ``WxF`` is a fresh ``jetfleet up --no-planner --router kv --workers W
--frontends F`` on private ports, its mockers packed ``--workers-per-process`` to a process (256;
``--speedup`` 10), waited on until every worker is registered. Then an open-loop client sends
``--rate`` streamed completions a second for ``--seconds`` (arrivals scheduled in advance, the
TTFT counted from each request's scheduled time), prompts from ``--prefixes`` shared heads plus a
unique tail (so the cached share shows whether the routers still find the caches), while a NATS
observer counts what every frontend receives (registrations and heartbeats on the workers
bucket, load reports) and reads every ``RequestObservation`` (its size on the wire, the route's
decision time), and the indexer's lag is sampled (the KV stream's last sequence against the
index's applied position). A dry-run ``jetfleet planner`` runs beside the fleet (it reads the
metric stream and judges the heartbeats, as an autoscaled fleet's does) and its decision time
per interval (``--planner-interval``) is read from its /metrics. One JSON document: per
configuration TTFT p50/p99, errors, cached share, route decision p50/p99, observation bytes,
messages/s a frontend hears by kind, CPU seconds per request of every component (frontends,
workers, indexer, nats-server, redis-server; the planner's per second), RSS of nats-server and
Redis, Redis memory, the indexer's lag, the planner's decision time, and how many times a judge
found a live worker silent (``workers_expired``: its ``worker_expired`` warnings in ``jetfleet
up``'s log; ``--log-dir`` keeps the logs). ``--burn C`` keeps C of a core busy in a side process
(the control: a small fleet given the background a large one puts on the same two cores).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import uvloop
from nats.aio.client import Client as NATSClient

from base.connect import connect_redis
from base.logs import configure_logging
from base.ports import free_port
from infra.command import cli_command
from router.kv.keys import namespace
from router.kv.redis_index import RedisPrefixIndex
from schemas import RequestObservation, Subjects, decode
from schemas.streams import HEARTBEATS_BUCKET, WORKERS_BUCKET
from tests.bench.loadgen import Connection, RequestResult, percentile
from tests.bench.procstat import cpu_seconds, tree

UP_LINE = re.compile(r"jetfleet is up.*\nNATS (\S+) \(clients publish.*Redis (\S+)")
MODEL = "jetfleet-tiny"
KINDS = ("frontend", "worker", "indexer", "nats-server", "redis-server", "up", "other")


def kind_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return "other"
    words = [a.decode(errors="replace") for a in argv]
    name = Path(words[0].split(" ", 1)[0]).name if words else ""  # redis retitles itself
    if name in ("nats-server", "redis-server"):
        return name
    for w in words[1:]:
        if w in ("frontend", "worker", "indexer", "up"):
            return w
    return "other"


def cpu_by_kind(root: int) -> dict[str, float]:
    out: dict[str, float] = dict.fromkeys(KINDS, 0.0)
    for pid in tree(root):
        out[kind_of(pid)] += cpu_seconds(pid)
    return out


def rss_mib(root: int, kind: str) -> float:
    total = 0
    for pid in tree(root):
        if kind_of(pid) != kind:
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return round(total / 1024, 1)


@dataclass
class Running:
    proc: subprocess.Popen[bytes]
    base_url: str
    nats_url: str
    redis_url: str
    log: Path
    started_s: float


def start_up(tmp: Path, workers: int, frontends: int, args: argparse.Namespace) -> Running:
    port = free_port()
    argv = cli_command(
        "up", "--port", str(port), "--nats-port", "0", "--redis-port", "0",
        "--state-dir", str(tmp / "state"), "--no-planner", "--router", "kv",
        "--workers", str(workers), "--frontends", str(frontends),
        "--workers-per-process", str(min(args.workers_per_process, workers)),
        "--speedup", str(args.speedup), "--log-level", "warning",
    )  # fmt: skip
    log = tmp / "up.log"
    t0 = time.monotonic()
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + args.start_timeout
    while True:
        found = UP_LINE.search(log.read_text(errors="replace"))
        if found:
            break
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"jetfleet up did not come up:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return Running(proc, f"http://127.0.0.1:{port}", found.group(1), found.group(2), log, t0)


async def registered(nats_url: str, subjects: Subjects) -> int:
    nc = await nats.connect(nats_url)
    try:
        kv = await nc.jetstream().key_value(subjects.bucket_name(WORKERS_BUCKET))
        try:
            return len(await kv.keys())
        except Exception:  # no keys yet
            return 0
    finally:
        await nc.close()


def stop_up(run: Running) -> None:
    run.proc.send_signal(signal.SIGINT)
    try:
        run.proc.wait(180)
    except subprocess.TimeoutExpired:
        run.proc.kill()
        run.proc.wait(30)


def prompts(n: int, heads: int, head_chars: int, tail_chars: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    letters = string.ascii_letters + " "
    pool = ["".join(rng.choices(letters, k=head_chars)) for _ in range(heads)]
    return [rng.choice(pool) + "".join(rng.choices(letters, k=tail_chars)) for _ in range(n)]


@dataclass
class Heard:
    """What one frontend hears, counted by a subscriber of the same subjects."""

    counts: Counter[str] = field(default_factory=Counter)
    obs_bytes: list[int] = field(default_factory=list)
    obs: list[RequestObservation] = field(default_factory=list)


async def listen(nats_url: str, subjects: Subjects, heard: Heard) -> NATSClient:
    """What a frontend hears: the registrations, the judges' presence and the load reports;
    the heartbeats (which only the judges read) are counted apart."""
    nc = await nats.connect(nats_url)
    bucket = subjects.bucket_name(WORKERS_BUCKET)

    async def on_kv(msg: Any) -> None:
        heard.counts["registrations"] += 1

    async def on_beat(msg: Any) -> None:
        heard.counts["heartbeats (judges only)"] += 1

    async def on_judge(msg: Any) -> None:
        heard.counts["judges"] += 1

    async def on_metrics(msg: Any) -> None:
        heard.counts["load_reports"] += 1

    async def on_obs(msg: Any) -> None:
        heard.obs_bytes.append(len(msg.data))
        heard.obs.append(decode(msg.data, RequestObservation))

    await nc.subscribe(f"$KV.{bucket}.>", cb=on_kv)
    await nc.subscribe(f"$KV.{subjects.bucket_name(HEARTBEATS_BUCKET)}.>", cb=on_beat)
    await nc.subscribe(subjects.judges(), cb=on_judge)
    await nc.subscribe(subjects.metrics_all(), cb=on_metrics)
    await nc.subscribe(f"{subjects.prefix}.obs.>", cb=on_obs)
    await nc.flush()
    await nc.flush()
    return nc


async def sample_lag(
    nats_url: str, redis_url: str, subjects: Subjects, stop: asyncio.Event
) -> list[float]:
    """Every 50 ms: the KV stream's last sequence; the lag of a sample is the time until the
    index's applied position reached it (so it is known to 50 ms)."""
    nc = await nats.connect(nats_url)
    redis = await connect_redis(redis_url)
    index = RedisPrefixIndex(redis, namespace(subjects.prefix))
    js = nc.jetstream()
    pending: list[tuple[float, int]] = []
    lags: list[float] = []
    try:
        while not stop.is_set():
            now = time.monotonic()
            last = (await js.stream_info(subjects.stream_name("KV"))).state.last_seq
            applied = await index.applied_seq()
            pending.append((now, last))
            while pending and applied >= pending[0][1]:
                lags.append((now - pending.pop(0)[0]) * 1000)
            await asyncio.sleep(0.05)
    finally:
        await index.aclose()
        await redis.aclose()
        await nc.close()
    return lags


async def open_loop(
    url: str, items: list[str], rate: float, args: argparse.Namespace
) -> list[RequestResult]:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    idle: list[Connection] = []
    results: list[RequestResult] = []
    t0 = time.perf_counter() + 0.2

    async def one(i: int, prompt: str) -> None:
        at = t0 + i / rate
        await asyncio.sleep(max(at - time.perf_counter(), 0))
        conn = idle.pop() if idle else Connection(host, int(port))
        body = {
            "model": MODEL, "prompt": prompt, "max_tokens": args.output_tokens,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
        }  # fmt: skip
        late = time.perf_counter() - at  # the client itself was behind: count it in the TTFT
        try:
            res = await conn.stream_completion("/v1/completions", body)
            idle.append(conn)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            res = RequestResult(False, error=repr(exc))
            conn.close()
        if res.ttft_s:
            res.ttft_s += late
        results.append(res)

    await asyncio.gather(*(one(i, p) for i, p in enumerate(items)))
    for c in idle:
        c.close()
    return results


async def measure(run: Running, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    subjects = Subjects()
    n = int(args.rate * args.seconds)
    items = prompts(n + 20, args.prefixes, args.head_chars, args.tail_chars, seed)
    warm = await open_loop(run.base_url, items[:20], 10.0, args)  # caches of every head warm
    heard = Heard()
    listener = await listen(run.nats_url, subjects, heard)
    stop = asyncio.Event()
    lagger = asyncio.create_task(sample_lag(run.nats_url, run.redis_url, subjects, stop))
    redis = await connect_redis(run.redis_url)
    cpu0, t0 = cpu_by_kind(run.proc.pid), time.monotonic()
    results = await open_loop(run.base_url, items[20:], args.rate, args)
    wall = time.monotonic() - t0
    cpu1 = cpu_by_kind(run.proc.pid)
    await asyncio.sleep(1.0)  # the last observations
    stop.set()
    lags = await lagger
    mem = await redis.info("memory")
    await redis.aclose()
    await listener.close()
    ok = [r for r in results if r.ok]
    ttft = [r.ttft_s * 1000 for r in ok if r.ttft_s]
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    route_us = [o.route.decision_us for o in heard.obs if o.route is not None]
    cands = [len(o.route.candidates) for o in heard.obs if o.route is not None]
    cpu = {k: round(cpu1[k] - cpu0[k], 3) for k in KINDS}
    per_req = {f"{k}_ms": round(1000 * v / max(len(results), 1), 3) for k, v in cpu.items()}
    return {
        "requests": len(results),
        "errors": len(results) - len(ok),
        "error_samples": sorted({r.error or "" for r in results if not r.ok})[:3],
        "warm_errors": sum(not r.ok for r in warm),
        "achieved_rps": round(len(results) / wall, 1),
        "ttft_p50_ms": round(percentile(ttft, 50), 1),
        "ttft_p99_ms": round(percentile(ttft, 99), 1),
        "cached_share": round(sum(r.cached_tokens for r in ok) / max(prompt_tokens, 1), 3),
        "route_decision_p50_us": round(percentile(route_us, 50)),
        "route_decision_p99_us": round(percentile(route_us, 99)),
        "observation_bytes_mean": round(sum(heard.obs_bytes) / max(len(heard.obs_bytes), 1)),
        "observation_bytes_max": max(heard.obs_bytes, default=0),
        "observed_candidates_max": max(cands, default=0),
        "frontend_hears_per_s": {k: round(v / wall, 1) for k, v in heard.counts.items()},
        "cpu_s": cpu,
        "cpu_per_request": per_req,
        "nats_rss_mib": rss_mib(run.proc.pid, "nats-server"),
        "redis_rss_mib": rss_mib(run.proc.pid, "redis-server"),
        "redis_used_memory_mib": round(int(mem["used_memory"]) / 2**20, 1),
        "indexer_lag_p50_ms": round(percentile(lags, 50)),
        "indexer_lag_p99_ms": round(percentile(lags, 99)),
    }


BURN = """
import sys, time
share, tick = float(sys.argv[1]), 0.01
while True:
    t = time.perf_counter() + share * tick
    while time.perf_counter() < t:
        pass
    time.sleep((1 - share) * tick)
"""


def burner(cores: float) -> subprocess.Popen[bytes] | None:
    """A process that keeps ``cores`` of one core busy (a 10 ms duty cycle): the background a
    large simulated fleet puts on this machine, given to a small one, to tell what the fleet
    costs per request from what its neighbours on the same two cores do to the latency."""
    if cores <= 0:
        return None
    return subprocess.Popen([sys.executable, "-c", BURN, str(min(cores, 1.0))])


def start_planner(run: Running, tmp: Path, args: argparse.Namespace) -> tuple[Any, int]:
    """A dry-run planner beside the fleet (``up --no-planner`` packs its workers, which the
    planner's local connector cannot): it reads the metric stream and judges the heartbeats as
    an autoscaled fleet's does, and times each interval it closes."""
    port = free_port()
    argv = cli_command(
        "planner", "--nats", run.nats_url, "--dry-run", "--interval", str(args.planner_interval),
        "--metrics-port", str(port), "--log-level", "warning",
    )  # fmt: skip
    with (tmp / "planner.log").open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    return proc, port


def planner_figures(port: int, proc: Any, cpu_s: float, wall_s: float) -> dict[str, Any]:
    """Decision time (``jetfleet_planner_decision_seconds``: mean, and the bucket its slowest
    fell in) and the planner's CPU, from its /metrics."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError as exc:
        return {"error": repr(exc), "alive": proc.poll() is None}
    total = count = 0.0
    buckets: list[tuple[float, float]] = []
    for line in text.splitlines():
        if line.startswith("jetfleet_planner_decision_seconds_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith("jetfleet_planner_decision_seconds_count"):
            count = float(line.rsplit(" ", 1)[1])
        elif line.startswith("jetfleet_planner_decision_seconds_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(le), float(line.rsplit(" ", 1)[1])))
    slowest = next((le for le, n in sorted(buckets) if n >= count), None) if count else None
    return {
        "intervals": int(count),
        "decision_ms_mean": round(1000 * total / count, 2) if count else None,
        "decision_ms_slowest_under": round(1000 * slowest, 2) if slowest is not None else None,
        "cpu_per_s": round(cpu_s / wall_s, 3),
    }


def run_config(workers: int, frontends: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="jetfleet-fleet-scale-") as d:
        tmp = Path(d)
        run = start_up(tmp, workers, frontends, args)
        try:
            deadline = time.monotonic() + args.start_timeout
            subjects = Subjects()
            while asyncio.run(registered(run.nats_url, subjects)) < workers:
                if time.monotonic() > deadline or run.proc.poll() is not None:
                    raise RuntimeError(
                        f"not every worker registered:\n{run.log.read_text()[-3000:]}"
                    )
                time.sleep(1.0)
            started = round(time.monotonic() - run.started_s, 1)
            planner, planner_port = start_planner(run, tmp, args)
            burn = burner(args.burn)
            idle0 = cpu_by_kind(run.proc.pid)
            time.sleep(args.idle_seconds)
            idle1 = cpu_by_kind(run.proc.pid)
            planner_cpu0, t_planner = cpu_seconds(planner.pid), time.monotonic()
            try:
                row = uvloop.run(measure(run, args, seed=workers + frontends))
                row["planner"] = planner_figures(
                    planner_port,
                    planner,
                    cpu_seconds(planner.pid) - planner_cpu0,
                    time.monotonic() - t_planner,
                )
            finally:
                planner.send_signal(signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    planner.wait(30)
                if planner.poll() is None:
                    planner.kill()
                    planner.wait()
                if burn is not None:
                    burn.kill()
                    burn.wait()
            row["start_s"] = started
            row["workers_expired"] = run.log.read_text(errors="replace").count("worker_expired")
            row["idle_cpu_per_s"] = {
                k: round((idle1[k] - idle0[k]) / args.idle_seconds, 3) for k in KINDS
            }
        finally:
            stop_up(run)
            if args.log_dir:
                args.log_dir.mkdir(parents=True, exist_ok=True)
                shutil.copy(run.log, args.log_dir / f"up-{workers}x{frontends}.log")
    return {"workers": workers, "frontends": frontends, "burn_cores": args.burn, **row}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--configs", default="16x1,256x1,1024x1,16x8,1024x2,1024x8")
    ap.add_argument("--rate", type=float, default=40.0, help="requests per second")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--prefixes", type=int, default=40)
    ap.add_argument("--head-chars", type=int, default=1024)
    ap.add_argument("--tail-chars", type=int, default=128)
    ap.add_argument("--speedup", type=float, default=10.0)
    ap.add_argument("--workers-per-process", type=int, default=256)
    ap.add_argument("--start-timeout", type=float, default=300.0)
    ap.add_argument("--planner-interval", type=float, default=5.0, help="s between decisions")
    ap.add_argument(
        "--burn", type=float, default=0.0, help="cores a side process keeps busy (at most 1)"
    )
    ap.add_argument("--log-dir", type=Path, help="keep each configuration's jetfleet up log here")
    args = ap.parse_args(argv)
    configure_logging("warning")
    out: dict[str, Any] = {
        "benchmark": "fleet_scale",
        "rate": args.rate,
        "seconds": args.seconds,
        "configs": [],
    }
    for spec in args.configs.split(","):
        w, f = (int(x) for x in spec.lower().split("x"))
        row = run_config(w, f, args)
        print(json.dumps(row), file=sys.stderr)
        out["configs"].append(row)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
