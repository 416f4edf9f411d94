"""Soak: ``jetfleet up`` under steady load for a while, the RSS of every process it runs sampled
over time; prints JSON (per process: RSS at the start of the measured window and at its end, and
the growth in percent).

    python -m tests.chaos.soak --minutes 30 [--concurrency 16] [--every-s 15]

The fleet is the README's (``jetfleet up`` on its embedded defaults: NATS, Redis, the planner and
its connector, the mocker workers), on free ports in a temporary directory. The load is chat
completions with a mix of shared and unique prompts. RSS is read from ``/proc`` for ``up`` and
every descendant (the connector's workers included). The first ``--warmup`` share of the run is
not judged (caches, pools and allocator arenas filling); growth compares the median of the
samples in the next tenth of the run with the median of the last tenth.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from base.ports import free_port
from infra.command import cli_command
from tests.bench.procstat import tree


def _name(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in argv if a]
    if words and words[0].endswith(("nats-server", "redis-server")):
        return Path(words[0]).name
    if "infra.cli" in words:
        rest = words[words.index("infra.cli") + 1 :]
        if rest[:1] == ["worker"] and "--worker-id" in rest:
            return f"worker {rest[rest.index('--worker-id') + 1]}"
        return " ".join(rest[:2]) if rest[:1] == ["connector"] else rest[0]
    return Path(words[0]).name if words else "?"


def _rss_kb(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    found = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(found.group(1)) if found else 0


def sample(root: int) -> dict[str, int]:
    """RSS (kB) of ``root`` and every descendant, by a readable name."""
    out = {}
    for pid in tree(root):
        rss = _rss_kb(pid)
        if rss:
            out[f"{_name(pid)} [{pid}]"] = rss
    return out


async def load(url: str, concurrency: int, stop: asyncio.Event, counts: dict[str, int]) -> None:
    heads = [f"Shared system prompt {i}: " + "context " * 200 for i in range(8)]

    async def one_client(i: int, http: httpx.AsyncClient) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            content = heads[(i + n) % len(heads)] + f"question {i}-{n}"
            body = {
                "model": "jetfleet-tiny",
                "messages": [{"role": "user", "content": content}],
                "max_tokens": 32,
            }
            try:
                r = await http.post(f"{url}/v1/chat/completions", json=body)
                key = "ok" if r.status_code == 200 else f"http_{r.status_code}"
                counts[key] = counts.get(key, 0) + 1
            except httpx.HTTPError as exc:
                key = type(exc).__name__
                counts[key] = counts.get(key, 0) + 1

    async with httpx.AsyncClient(timeout=120) as http:
        await asyncio.gather(*(one_client(i, http) for i in range(concurrency)))


async def soak(
    minutes: float, concurrency: int, every_s: float, warmup: float
) -> dict[str, object]:
    state = Path(tempfile.mkdtemp(prefix="jetfleet-soak-"))
    port = free_port()
    argv = cli_command(
        "up", "--port", str(port), "--nats-port", str(free_port()),
        "--redis-port", str(free_port()), "--state-dir", str(state),
    )  # fmt: skip
    log = (state / "up.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)  # noqa: ASYNC220
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while b"jetfleet is up" not in (state / "up.log").read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((state / "up.log").read_text()[-3000:])
            await asyncio.sleep(0.2)
        stop, counts = asyncio.Event(), {"ok": 0}
        loader = asyncio.create_task(load(url, concurrency, stop, counts))
        samples: list[tuple[float, dict[str, int]]] = []
        t0, end = time.monotonic(), time.monotonic() + minutes * 60
        while time.monotonic() < end:
            samples.append((time.monotonic() - t0, sample(proc.pid)))
            await asyncio.sleep(every_s)
        samples.append((time.monotonic() - t0, sample(proc.pid)))
        stop.set()
        await loader
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
    run_s = samples[-1][0]
    start = [s for t, s in samples if warmup * run_s <= t <= (warmup + 0.1) * run_s]
    last = [s for t, s in samples if t >= 0.9 * run_s]
    per_process = {}
    for name in sorted(set(samples[-1][1])):
        a = [s[name] for s in start if name in s]
        b = [s[name] for s in last if name in s]
        if not a or not b:
            continue
        first, final = statistics.median(a), statistics.median(b)
        per_process[name] = {
            "rss_mb_start": round(first / 1024, 1),
            "rss_mb_end": round(final / 1024, 1),
            "growth_pct": round(100 * (final - first) / first, 2),
        }
    return {
        "minutes": round(run_s / 60, 1),
        "concurrency": concurrency,
        "requests": counts,
        "warmup_share": warmup,
        "samples": len(samples),
        "processes": per_process,
        "max_growth_pct": max((p["growth_pct"] for p in per_process.values()), default=0.0),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--every-s", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=0.2, help="share of the run not judged")
    args = ap.parse_args(argv)
    result = asyncio.run(soak(args.minutes, args.concurrency, args.every_s, args.warmup))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
