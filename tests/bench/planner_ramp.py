"""Autoscaling under a load ramp: the planner + local connector against fixed fleets and an oracle.

    python -m tests.bench.planner_ramp [--fleets planner,peak,trough] [--time-scale 1.0]

The load (open loop, requests spaced evenly at the current rate) holds ``--low-rps`` for a
while, ramps linearly to ``--peak-factor`` times that, holds, ramps back down and holds low
again (phase lengths ``--phases``, seconds). Every request: ~``--isl`` random prompt tokens,
``--osl`` output tokens (``ignore_eos``), streamed. Workers are mocker processes at speedup 1
with ``--max-num-seqs`` 8, so one replica serves about ``--replica-rps`` requests/s within the
latency targets (the capacity profile the planner gets; measure yours with ``jetfleet profile``).

Per fleet it reports the share of requests meeting both targets (TTFT <= ``--ttft-target``,
mean ITL <= ``--itl-target``; errors and shed requests count as misses), the replica-seconds
used (worker processes alive, sampled every 0.25 s, start-up and drain included), the scaling
actions and the peak replicas:

- ``planner``: starts at the trough size; ``jetfleet planner`` (a process) decides, the local
  connector (in this process) starts and drains real worker processes;
- ``peak`` / ``trough``: fixed fleets sized for the peak and for the trough.

``--disagg``: the fleet is a prefill pool and a decode pool (each starting at the trough size,
every prefill placed remotely), the planner plans both roles (``--roles prefill,decode``) and the
decisions are reported per role: both pools must follow the ramp.

``oracle_replica_s`` is what a planner knowing the load curve in advance would use: every second
``max(min_replicas, ceil(rate / replica_rps))`` replicas, nothing for start-up. The target is
``within_targets >= 0.95`` with ``replica_s / oracle_replica_s <= 1.3``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from base.connect import close_nats, connect_nats
from base.logs import configure_logging
from base.ports import free_port
from base.process import ProcessGroup, wait_http_ok
from base.topology import ensure_topology
from base.worker_watch import WorkerWatch
from infra.command import cli_command
from infra.embedded import EmbeddedNats
from infra.up import serving
from planner.connectors.base import ConnectorService
from planner.connectors.local import LocalScaler, LocalScalerConfig
from schemas import ScalingDecided, Subjects, decode
from tests.bench.loadgen import Connection, RequestResult, percentile, random_prompt
from tests.support.wait import wait_line

MODEL = "jetfleet-tiny"


@dataclass(frozen=True)
class Curve:
    low: float
    peak: float
    phases: tuple[float, float, float, float, float]  # low, up, peak, down, low (seconds)

    @property
    def duration(self) -> float:
        return sum(self.phases)

    def rate(self, t: float) -> float:
        low_a, up, hold, down, _ = self.phases
        if t < low_a:
            return self.low
        t -= low_a
        if t < up:
            return self.low + (self.peak - self.low) * t / up
        t -= up
        if t < hold:
            return self.peak
        t -= hold
        if t < down:
            return self.peak - (self.peak - self.low) * t / down
        return self.low

    def arrivals(self) -> list[float]:
        """Times of the requests: the k-th when the integral of the rate reaches k."""
        out: list[float] = []
        acc, t, dt = 0.0, 0.0, 0.001
        while t < self.duration:
            acc += self.rate(t) * dt
            while acc >= len(out) + 1:
                out.append(t)
            t += dt
        return out


def oracle_replica_s(curve: Curve, replica_rps: float, min_replicas: int) -> float:
    total, t = 0.0, 0.0
    while t < curve.duration:
        step = min(1.0, curve.duration - t)
        need = max(min_replicas, math.ceil(curve.rate(t) / replica_rps - 1e-9))
        total += need * step
        t += step
    return total


@dataclass
class Timed:
    at_s: float
    result: RequestResult


@dataclass
class Pool:
    host: str
    port: int
    idle: list[Connection] = field(default_factory=list)

    async def request(self, body: dict[str, object]) -> RequestResult:
        reused = bool(self.idle)
        conn = self.idle.pop() if reused else Connection(self.host, self.port)
        try:
            res = await conn.stream_completion("/v1/completions", body)
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
            conn.close()
            if reused:  # the server closed an idle keep-alive connection: not a failure
                return await self._fresh(body)
            return RequestResult(False, error=repr(exc))
        self.idle.append(conn)
        return res

    async def _fresh(self, body: dict[str, object]) -> RequestResult:
        conn = Connection(self.host, self.port)
        try:
            res = await conn.stream_completion("/v1/completions", body)
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
            conn.close()
            return RequestResult(False, error=repr(exc))
        self.idle.append(conn)
        return res

    def close(self) -> None:
        for c in self.idle:
            c.close()


async def drive(url: str, curve: Curve, args: argparse.Namespace) -> list[Timed]:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    pool = Pool(host, int(port))
    rng = random.Random(args.seed)
    out: list[Timed] = []

    async def one(at: float) -> None:
        body = {
            "model": MODEL,
            "prompt": random_prompt(rng, args.isl),
            "max_tokens": args.osl,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        out.append(Timed(at, await pool.request(body)))

    tasks = []
    start = time.monotonic()
    for at in curve.arrivals():
        await asyncio.sleep(max(0.0, start + at - time.monotonic()))
        tasks.append(asyncio.create_task(one(at)))
    await asyncio.gather(*tasks)
    pool.close()
    return out


async def sample_replicas(
    scaler: LocalScaler, stop: asyncio.Event, every_s: float, trace: list[tuple[float, int]]
) -> tuple[float, int]:
    """(replica-seconds, most replicas at once) of the worker processes alive until ``stop``."""
    total, peak = 0.0, 0
    start = last = time.monotonic()
    while not stop.is_set():
        await asyncio.sleep(every_s)
        now = time.monotonic()
        alive = sum(1 for c in scaler.group.children.values() if c.proc.poll() is None)
        total += alive * (now - last)
        peak = max(peak, alive)
        trace.append((now - start, alive))
        last = now
    return total, peak


def timeline(
    results: list[Timed],
    trace: list[tuple[float, int]],
    curve: Curve,
    args: argparse.Namespace,
    bucket_s: float = 10.0,
) -> list[dict[str, Any]]:
    """Per ``bucket_s`` of the run: load, replicas alive (max), share within targets."""
    rows = []
    t = 0.0
    while t < curve.duration:
        reqs = [x.result for x in results if t <= x.at_s < t + bucket_s]
        good = [
            r for r in reqs if r.ok and r.ttft_s <= args.ttft_target and r.itl_s <= args.itl_target
        ]
        alive = [n for at, n in trace if t <= at < t + bucket_s]
        rows.append(
            {
                "t_s": t,
                "rps": round(curve.rate(t + bucket_s / 2), 1),
                "replicas": max(alive, default=0),
                "within": round(len(good) / len(reqs), 3) if reqs else 1.0,
            }
        )
        t += bucket_s
    return rows


def score(results: list[Timed], args: argparse.Namespace) -> dict[str, Any]:
    ok = [t.result for t in results if t.result.ok]
    good = [
        r
        for r in ok
        if r.ttft_s <= args.ttft_target
        and r.itl_s <= args.itl_target
        and r.output_tokens == args.osl
    ]
    ttft = [r.ttft_s * 1000 for r in ok]
    itl = [r.itl_s * 1000 for r in ok]
    return {
        "requests": len(results),
        "errors": len(results) - len(ok),
        "within_targets": round(len(good) / len(results), 4) if results else 0.0,
        "ttft_ms_p50": round(percentile(ttft, 50), 1),
        "ttft_ms_p99": round(percentile(ttft, 99), 1),
        "itl_ms_p50": round(percentile(itl, 50), 2),
        "itl_ms_p99": round(percentile(itl, 99), 2),
    }


async def run_fleet(kind: str, curve: Curve, args: argparse.Namespace) -> dict[str, Any]:
    peak_n = max(args.min_replicas, math.ceil(curve.peak / args.replica_rps - 1e-9))
    low_n = max(args.min_replicas, math.ceil(curve.low / args.replica_rps - 1e-9))
    initial = {"planner": low_n, "peak": peak_n, "trough": low_n}[kind]
    roles = ("prefill", "decode") if args.disagg else ("agg",)
    tmp = Path(tempfile.mkdtemp(prefix="jetfleet-ramp-"))
    nats = EmbeddedNats(tmp / "nats", port=0)
    nats.start()
    group = ProcessGroup(tmp / "logs")
    subjects = Subjects("fleet")
    common = ["--nats", nats.url, "--log-level", "warning"]
    nc = await connect_nats(nats.url, name="bench-connector")
    await ensure_topology(nc.jetstream(), subjects)
    watch = WorkerWatch(nc, subjects)
    await watch.start()
    worker_args = ("--speedup", "1", "--max-num-seqs", str(args.max_num_seqs))
    scaler = LocalScaler(
        LocalScalerConfig(
            nats_url=nats.url,
            worker_command=tuple(cli_command("worker")),
            log_dir=tmp / "logs",
            worker_args=worker_args,
            log_level="warning",
        ),
        watch,
    )
    stop = asyncio.Event()
    connector = ConnectorService(nc, subjects, MODEL, scaler)
    decisions: list[ScalingDecided] = []

    async def on_decision(msg: Any) -> None:
        decisions.append(decode(msg.data, ScalingDecided))

    await nc.subscribe(subjects.scale_model(MODEL), cb=on_decision)
    tasks: list[asyncio.Task[Any]] = []
    alive_at: list[tuple[float, int]] = []
    t0 = time.monotonic()
    try:
        for role in roles:
            started = await scaler.start_workers(role, initial)
            if not started.ok:
                raise RuntimeError(started.detail)
        disagg = ("--disagg-policy", "always") if args.disagg else ()
        port = free_port()
        group.start(
            "frontend",
            cli_command(
                "frontend", *common, "--port", str(port), "--router", "least-loaded",
                "--max-waiting-per-worker", "100000", *disagg,
            ),
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(f"{url}/ready", 60, group, until=serving)
        if kind == "planner":
            profile = {
                "prefill_tokens_per_s": args.replica_rps * args.isl,
                "decode_tokens_per_s": args.replica_rps * args.osl,
            }
            planner = group.start(
                "planner",
                cli_command(
                    "planner", "--nats", nats.url, "--log-level", "info", "--model", MODEL,
                    "--interval", str(args.interval),
                    "--predictor", args.predictor,
                    "--ttft-target", str(args.ttft_target),
                    "--itl-target", str(args.itl_target),
                    "--scale-up-cooldown", str(args.interval),
                    "--scale-down-cooldown", str(args.scale_down_cooldown),
                    "--roles", ",".join(roles),
                    *[x for r in roles for x in ("--min-replicas", f"{r}={args.min_replicas}")],
                    *[x for r in roles for x in ("--max-replicas", f"{r}={args.max_replicas}")],
                    "--set", f"profile.prefill_tokens_per_s={profile['prefill_tokens_per_s']}",
                    "--set", f"profile.decode_tokens_per_s={profile['decode_tokens_per_s']}",
                    *[x for s in args.set for x in ("--set", s)],
                ),
            )  # fmt: skip
            tasks.append(asyncio.create_task(connector.run(stop)))
            # the load starts once the planner listens: on a busy machine its start-up (imports,
            # connections) would otherwise eat a short ramp's first phases
            await asyncio.to_thread(wait_line, planner.log_path, "planner_ready", 60, planner.proc)
        sampler = asyncio.create_task(sample_replicas(scaler, stop, 0.25, alive_at))
        print(f"[{kind}] {initial} replicas, {curve.duration:.0f}s of load", file=sys.stderr)
        t0 = time.monotonic()
        wall_t0 = time.time()
        results = await drive(url, curve, args)
        wall = time.monotonic() - t0
        stop.set()
        replica_s, peak_replicas = await sampler
        for t in tasks:
            await t
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
            with contextlib.suppress(BaseException):
                await t
        await scaler.close()
        await watch.stop()
        await close_nats(nc)
        group.stop_all(timeout_s=20)
        nats.stop()
    out = {
        "fleet": kind,
        "wall_s": round(wall, 1),
        "replica_s": round(replica_s, 1),
        "scaling_actions": connector.applied,
        "workers_started": scaler.started,
        "workers_stopped": scaler.stopped,
        "peak_replicas": peak_replicas,
        **score(results, args),
        "timeline": timeline(results, alive_at, curve, args),
        "decisions": [
            {
                "t_s": round(d.ts_s - wall_t0, 1),
                "role": d.role,
                "current": d.current_replicas,
                "desired": d.desired_replicas,
                "predicted_rps": round(d.predicted_rps, 1),
                "why": "; ".join(d.reasons),
            }
            for d in decisions
            if d.changed
        ],
    }
    brief = {k: v for k, v in out.items() if k not in ("timeline", "decisions")}
    print(f"[{kind}] {json.dumps(brief)}", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fleets", default="planner,peak,trough")
    ap.add_argument("--low-rps", type=float, default=8.0)
    ap.add_argument("--peak-factor", type=float, default=4.0)
    ap.add_argument("--phases", default="20,30,30,30,20", help="low,up,peak,down,low seconds")
    ap.add_argument("--time-scale", type=float, default=1.0, help="multiply phase lengths")
    ap.add_argument("--isl", type=int, default=256)
    ap.add_argument("--osl", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--replica-rps", type=float, default=10.0, help="capacity per replica")
    ap.add_argument("--ttft-target", type=float, default=0.5)
    ap.add_argument("--itl-target", type=float, default=0.05)
    ap.add_argument("--interval", type=float, default=3.0)
    ap.add_argument("--predictor", default="holt")
    ap.add_argument("--scale-down-cooldown", type=float, default=10.0)
    ap.add_argument("--min-replicas", type=int, default=1)
    ap.add_argument("--max-replicas", type=int, default=8)
    ap.add_argument("--set", action="append", default=[], help="more planner settings")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--disagg", action="store_true", help="prefill and decode pools")
    args = ap.parse_args(argv)
    configure_logging("warning", "console")
    phases = tuple(float(x) * args.time_scale for x in args.phases.split(","))
    if len(phases) != 5:
        ap.error("--phases needs five lengths")
    curve = Curve(args.low_rps, args.low_rps * args.peak_factor, phases)  # type: ignore[arg-type]
    oracle = oracle_replica_s(curve, args.replica_rps, args.min_replicas)
    runs = [asyncio.run(run_fleet(k, curve, args)) for k in args.fleets.split(",") if k]
    for r in runs:
        r["replica_s_vs_oracle"] = round(r["replica_s"] / oracle, 3) if oracle else 0.0
    print(
        json.dumps(
            {
                "benchmark": "planner_ramp",
                "load": {
                    "low_rps": curve.low,
                    "peak_rps": curve.peak,
                    "phases_s": list(phases),
                    "requests": len(curve.arrivals()),
                    "isl": args.isl,
                    "osl": args.osl,
                },
                "targets": {"ttft_s": args.ttft_target, "itl_s": args.itl_target},
                "replica_rps": args.replica_rps,
                "oracle_replica_s": round(oracle, 1),
                "fleets": runs,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
