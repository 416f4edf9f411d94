"""A thousand mocker workers in a few processes (``jetfleet worker --replicas``): what starting
them, keeping them idle and draining them costs.

    python -m tests.bench.replicas_scale [--workers 1024] [--processes 1,2,4] [--idle-s 20]

For each process count P, on fresh embedded servers (NATS with ``sync_interval: always`` and
Redis, as ``jetfleet servers`` starts them): P worker processes of ``workers / P`` replicas each;

- ``start_s``: from spawning them to the last one logging all its replicas registered (the log
  lines' own clock), checked against the registrations bucket; the CPU seconds each process and
  nats-server spent on it;
- after ``--settle-s``, the idle CPU over ``--idle-s`` (% of one core, from /proc) and the RSS
  of each worker process, of nats-server and of redis-server;
- ``drain_s``: SIGTERM to all of them until the last has exited; the registrations left (0).

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from base.connect import close_nats, connect_nats
from base.logs import configure_logging
from infra.command import cli_command
from infra.embedded import EmbeddedNats, EmbeddedRedis
from infra.tools import fleet_status
from schemas import Subjects
from tests.bench.procstat import cpu_seconds


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _started_at(log: Path, replicas: int) -> float | None:
    """The wall clock at which the process said all its replicas were registered."""
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if '"replicas_started"' in line or (replicas == 1 and '"worker_ready"' in line):
            entry = json.loads(line)
            if entry.get("started", 1) == replicas:
                return datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00")).timestamp()
    return None


async def _registered(nats_url: str, prefix: str) -> dict[str, int]:
    nc = await connect_nats(nats_url, name="bench-status")
    try:
        report = await fleet_status(nc, Subjects(prefix))
    finally:
        await close_nats(nc)
    counts: dict[str, int] = {}
    for row in report["workers"]:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    return counts


def _spawn(
    nats_url: str, prefix: str, name: str, replicas: int, log: Path
) -> subprocess.Popen[bytes]:
    argv = cli_command(
        "worker", "--nats", nats_url, "--subject-prefix", prefix, "--log-level", "info",
        "--worker-id", name, "--replicas", str(replicas),
    )  # fmt: skip
    with log.open("wb") as sink:
        return subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)


def run_one(
    workers: int, processes: int, settle_s: float, idle_s: float, tmp: Path
) -> dict[str, Any]:
    nats = EmbeddedNats(tmp / f"nats-{processes}", sync_interval="always")
    redis = EmbeddedRedis(tmp / f"redis-{processes}")
    nats.start()
    redis.start()
    prefix = f"scale{processes}"
    per = workers // processes
    procs: list[subprocess.Popen[bytes]] = []
    try:
        began = time.time()
        logs = [tmp / f"{prefix}-{i}.log" for i in range(processes)]
        procs = [_spawn(nats.url, prefix, f"p{i}", per, logs[i]) for i in range(processes)]
        done: dict[int, float] = {}
        while len(done) < processes:
            for i, log in enumerate(logs):
                if i in done:
                    continue
                assert procs[i].poll() is None, log.read_text(errors="replace")[-3000:]
                at = _started_at(log, per)
                if at is not None:
                    done[i] = at
            time.sleep(0.5)
        start_cpu = {f"worker-{i}": round(cpu_seconds(p.pid), 2) for i, p in enumerate(procs)}
        start_cpu["nats-server"] = round(cpu_seconds(nats.pid), 2)
        registered = asyncio.run(_registered(nats.url, prefix))
        look_until = time.monotonic() + 10.0  # a read of the bucket on a loaded machine can
        while sum(registered.values()) < workers and time.monotonic() < look_until:  # lag
            time.sleep(0.2)
            registered = asyncio.run(_registered(nats.url, prefix))
        time.sleep(settle_s)
        pids = {f"worker-{i}": p.pid for i, p in enumerate(procs)}
        pids |= {"nats-server": nats.pid, "redis-server": redis.pid}
        before = {n: cpu_seconds(p) for n, p in pids.items()}
        t0 = time.monotonic()
        time.sleep(idle_s)
        elapsed = time.monotonic() - t0
        idle = {n: round((cpu_seconds(p) - before[n]) / elapsed * 100, 1) for n, p in pids.items()}
        rss = {n: rss_mb(p) for n, p in pids.items()}
        t1 = time.monotonic()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(300) for p in procs]
        drain_s = time.monotonic() - t1
        left = asyncio.run(_registered(nats.url, prefix))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        nats.stop()
        redis.stop()
    return {
        "processes": processes,
        "replicas_per_process": per,
        "start_s": round(max(done.values()) - began, 2),
        "start_cpu_s": start_cpu,
        "registered": registered,
        "idle_cpu_pct": idle,
        "idle_cpu_pct_per_worker": round(
            sum(v for n, v in idle.items() if n.startswith("worker")) / workers, 4
        ),
        "rss_mb": rss,
        "drain_s": round(drain_s, 2),
        "exit_codes": codes,
        "registrations_left": sum(left.values()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workers", type=int, default=1024)
    ap.add_argument("--processes", default="1,2,4", help="process counts, comma-separated")
    ap.add_argument("--settle-s", type=float, default=10.0)
    ap.add_argument("--idle-s", type=float, default=20.0)
    args = ap.parse_args(argv)
    configure_logging("warning", "console")
    runs = []
    with tempfile.TemporaryDirectory(prefix="replicas-scale-") as tmp:
        for processes in (int(p) for p in args.processes.split(",")):
            runs.append(run_one(args.workers, processes, args.settle_s, args.idle_s, Path(tmp)))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"workers": args.workers, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
