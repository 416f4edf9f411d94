"""What an index-scale run reads off the servers and processes: Redis memory, per-command
statistics and slow calls (every node of a cluster), CPU seconds and RSS of processes, and the
indexing lag (how long until the index holds what the stream held at a moment).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from base.cancelling import cancel_and_wait
from router.kv import lua
from tests.bench.loadgen import percentile
from tests.bench.procstat import cpu_seconds

_SCRIPTS = {
    hashlib.sha1(src.encode()).hexdigest(): name
    for name, src in (
        ("route", lua.ROUTE),
        ("release", lua.RELEASE),
        ("match", lua.MATCH),
        ("slots", lua.SLOTS),
        ("sync_slots", lua.SYNC_SLOTS),
        ("sweep", lua.SWEEP),
        ("free_slots", lua.FREE_SLOTS),
        ("apply", lua.APPLY),
    )
}


def _s(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def call_label(args: list[Any]) -> str:
    """A slow call as a name: the script (EVALSHA by its SHA1, EVAL of APPLY by its first key,
    the shard's position) or the command."""
    cmd = _s(args[0]).upper() if args else "?"
    if cmd == "EVALSHA" and len(args) > 1:
        return f"EVALSHA {_SCRIPTS.get(_s(args[1]), '?')}"
    if cmd == "EVAL" and len(args) > 3:
        return "EVAL apply" if _s(args[3]).endswith(":pos") else "EVAL"
    if cmd in ("SCRIPT", "CONFIG", "CLUSTER") and len(args) > 1:
        return f"{cmd} {_s(args[1]).upper()}"
    return cmd


SLOWLOG_LEN = 1024
CommandStats = dict[str, tuple[int, int]]  # command -> (calls, µs inside it)


class RedisStats:
    """INFO, CONFIG and SLOWLOG of every redis-server (summed or merged over a cluster's)."""

    def __init__(self, nodes: list[tuple[str, int, str]]) -> None:
        self.nodes = nodes
        self.clients = [redis.Redis.from_url(url, socket_timeout=10) for _, _, url in nodes]
        self._slow: list[tuple[float, float, str]] = []
        self._seen = [-1] * len(nodes)  # the newest slow log entry kept, per node

    def used_memory(self) -> int:
        return sum(int(c.info("memory")["used_memory"]) for c in self.clients)

    def reset(self) -> None:
        """Zero the command statistics and the slow log; log every call over 1 ms."""
        for c in self.clients:
            c.config_set("slowlog-log-slower-than", 1000)
            c.config_set("slowlog-max-len", SLOWLOG_LEN)
            _command(c, "SLOWLOG", "RESET")
            _command(c, "CONFIG", "RESETSTAT")
        self._slow.clear()
        self._seen = [-1] * len(self.clients)

    def commandstats(self) -> dict[str, CommandStats]:
        """Per node: command -> (calls, µs inside it)."""
        out: dict[str, CommandStats] = {}
        for (name, _, _), c in zip(self.nodes, self.clients, strict=True):
            out[name] = {
                key.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
                for key, v in c.info("commandstats").items()
            }
        return out

    def collect_slow(self) -> None:
        """Keep the calls logged since the last look (call it more often than the log fills:
        ``load_cell`` does every second, so no call is lost to the log's length)."""
        for i, c in enumerate(self.clients):
            newest = self._seen[i]
            for entry in _command(c, "SLOWLOG", "GET", SLOWLOG_LEN):
                id_, ts, dur, args = entry[:4]
                if int(id_) <= self._seen[i]:
                    break
                newest = max(newest, int(id_))
                self._slow.append((int(dur) / 1000, float(ts), call_label(list(args))))
            self._seen[i] = newest

    def slow_calls(self) -> list[tuple[float, float, str]]:
        """(ms, wall time s, label) of every call over the threshold since ``reset``, slowest
        first."""
        self.collect_slow()
        return sorted(self._slow, reverse=True)

    def cpu(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) for name, pid, _ in self.nodes}

    def close(self) -> None:
        for c in self.clients:
            c.close()


class SlowLogWatch:
    """Collects the slow log every ``every_s`` while it runs (``RedisStats.collect_slow``)."""

    def __init__(self, stats: RedisStats, every_s: float = 1.0) -> None:
        self.stats = stats
        self.every_s = every_s
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.every_s)
            await asyncio.to_thread(self.stats.collect_slow)

    async def stop(self) -> None:
        self._stop.set()
        await self._task


def _command(client: redis.Redis, *args: str | int) -> Any:
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def split_redis_cpu(cpu_s: float, before: CommandStats, after: CommandStats) -> dict[str, float]:
    """A node's CPU seconds shared out by the time spent inside each kind of command: ``apply``
    (EVAL: the indexers' writes), ``route`` (EVALSHA: routes and their releases; the sweeper's
    and the slot table's few calls too), ``other``; the rest (I/O, parsing) in the same
    proportions."""
    inside = {"apply": 0, "route": 0, "other": 0}
    for cmd, (_calls, usec) in after.items():
        kind = {"eval": "apply", "evalsha": "route"}.get(cmd, "other")
        inside[kind] += usec - before.get(cmd, (0, 0))[1]
    total = sum(inside.values()) or 1
    return {k: cpu_s * v / total for k, v in inside.items()}


def delta_calls(
    before: dict[str, CommandStats], after: dict[str, CommandStats], cmd: str
) -> tuple[int, int]:
    """(calls, µs inside) of ``cmd`` between two readings, over every node."""
    calls = usec = 0
    for node, stats in after.items():
        a, b = stats.get(cmd, (0, 0)), before.get(node, {}).get(cmd, (0, 0))
        calls, usec = calls + a[0] - b[0], usec + a[1] - b[1]
    return calls, usec


def summary_ms(values: list[float], prefix: str) -> dict[str, float]:
    return {
        f"{prefix}_p50_ms": round(percentile(values, 50), 3),
        f"{prefix}_p99_ms": round(percentile(values, 99), 3),
        f"{prefix}_max_ms": round(max(values, default=0.0), 3),
    }


@dataclass
class LagSampler:
    """Every ``every_s``: where the stream ends for each indexer group at that moment (the last
    sequence of the group's partitions, ``Env.tails``); the lag of the sample is the time until
    every group's applied position reaches it, found by polling the positions every
    ``poll_s``."""

    tails: Callable[[], Awaitable[list[int]]]
    positions: Callable[[], Awaitable[list[int]]]
    every_s: float = 0.1
    poll_s: float = 0.002
    samples: list[tuple[float, float]] = field(default_factory=list)  # (t monotonic, lag ms)
    _pending: list[tuple[float, list[int]]] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._sample()), asyncio.create_task(self._poll())]

    async def stop(self) -> None:
        """Stop; samples still pending count as lagging until now. The cancel is sent until the
        loops end: one landing as ``stream_info``'s reply comes in is lost on Python 3.11
        (``base.cancelling``), and a single cancel left the bench waiting here for good (the
        hangs of its CI smoke run)."""
        await cancel_and_wait(self._tasks)
        now = time.monotonic()
        self.samples += [(t, (now - t) * 1000) for t, _ in self._pending]
        self._pending.clear()
        self.samples.sort()

    async def _sample(self) -> None:
        while True:
            t = time.monotonic()
            self._pending.append((t, await self.tails()))
            await asyncio.sleep(max(0.0, t + self.every_s - time.monotonic()))

    async def _poll(self) -> None:
        while True:
            if self._pending:
                pos = await self.positions()
                now = time.monotonic()
                keep = []
                for t, tails in self._pending:
                    if all(p >= s for p, s in zip(pos, tails, strict=True)):
                        self.samples.append((t, (now - t) * 1000))
                    else:
                        keep.append((t, tails))
                self._pending = keep
            await asyncio.sleep(self.poll_s)

    def between(self, t0: float, t1: float) -> list[float]:
        return [lag for t, lag in self.samples if t0 <= t <= t1]


class CpuClock:
    """CPU seconds of named processes over an interval (a process that is gone counts what it
    had used when last sampled)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.start = {n: cpu_seconds(p) for n, p in pids.items()}
        self.last = dict(self.start)

    def sample(self) -> None:
        for n, p in self.pids.items():
            v = cpu_seconds(p)
            if v:
                self.last[n] = v

    def read(self) -> dict[str, float]:
        self.sample()
        return {n: round(self.last[n] - self.start[n], 3) for n in self.pids}
