"""Stalls an index-scale load cell provokes (``index_scale_cells.Probe``), each at a quarter of
the cell: a worker's departure (its registration deleted: the indexer retires its slot, the
sweeper clears its bits), a snapshot of the index, and a failover of the indexer (the leader
SIGKILLed, the standby taking over when the lock's TTL runs out).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.bench.index_scale_cells import Run
from tests.bench.index_scale_env import Indexer
from tests.bench.index_scale_fleet import worker_id
from tests.bench.index_scale_measure import LagSampler

AT = 0.25  # the stall starts at this fraction of the cell
RECOVERED_LAG_MS = 100.0


def log_times(path: Path, event: str, after: float) -> list[float]:
    """Monotonic times of a process's structlog lines ``event`` at or after ``after``."""
    wall = time.time() - time.monotonic()
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if f'"{event}"' not in line:
            continue
        try:
            t = datetime.fromisoformat(json.loads(line)["timestamp"]).timestamp() - wall
        except (ValueError, KeyError):
            continue
        if t >= after:
            out.append(t)
    return out


async def _until(at: float) -> None:
    await asyncio.sleep(max(0.0, at - time.monotonic()))


@dataclass
class Departure:
    """A worker leaves: its key deleted from the workers bucket."""

    name: str = "departure"
    worker: int = 0
    holder_blocks: int = 0
    t_gone: float = 0.0
    t_dropped: float = 0.0
    t_swept: float = 0.0

    async def prepare(self, run: Run) -> None:
        """The worker holding the fleet's mean number of blocks, or closest to it."""
        f = run.fleet
        s = f.spec
        held = [
            len(ws.roots) + len(ws.branches) * (s.branch_blocks - 1) + len(ws.queue) * s.tail_blocks
            for ws in f.workers
        ]
        mean = sum(held) / len(held)
        self.worker = min(range(len(held)), key=lambda w: abs(held[w] - mean))
        self.holder_blocks = held[self.worker]

    async def act(self, run: Run, t0: float, seconds: float) -> None:
        await _until(t0 + AT * seconds)
        self.t_gone = time.monotonic()
        await run.env.deregister(worker_id(self.worker))
        logs = [ix.child.log_path for ix in run.env.indexers.values()]
        deadline = t0 + 3 * seconds + 30
        while time.monotonic() < deadline and not self.t_swept:
            await asyncio.sleep(0.1)
            for path in logs:
                swept = log_times(path, "indexer_swept_slots", self.t_gone)
                dropped = log_times(path, "indexer_dropped_worker", self.t_gone)
                self.t_swept = self.t_swept or (swept[0] if swept else 0.0)
                self.t_dropped = self.t_dropped or (dropped[0] if dropped else 0.0)

    def window(self, run: Run, lag: LagSampler) -> tuple[float, float]:
        return self.t_gone, self.t_swept or time.monotonic()

    def report(self) -> dict[str, Any]:
        return {
            "probe": self.name,
            "worker": worker_id(self.worker),
            "worker_holder_blocks": self.holder_blocks,
            "slot_retired_after_ms": _ms(self.t_dropped - self.t_gone) if self.t_dropped else None,
            "swept_after_s": round(self.t_swept - self.t_gone, 2) if self.t_swept else None,
        }


@dataclass
class Snapshot:
    """An indexer that snapshots every ``every_s`` (the first falls inside the cell); each
    snapshot's duration read from its metric ``jetfleet_indexer_snapshot_seconds``."""

    every_s: float
    name: str = "snapshot"
    ix: Indexer | None = None
    taken: list[tuple[float, float]] = field(default_factory=list)  # (end, seconds)
    t0: float = 0.0

    async def prepare(self, run: Run) -> None:
        run.env.stop_indexers()
        (self.ix,) = await run.env.start_indexers(1, "--snapshot-every", str(self.every_s))

    async def act(self, run: Run, t0: float, seconds: float) -> None:
        assert self.ix is not None
        self.t0 = t0
        last = 0.0
        end = t0 + seconds
        while time.monotonic() < end or (not self.taken and time.monotonic() < end + 60):
            value = (await asyncio.to_thread(self.ix.metrics)).get(
                "jetfleet_indexer_snapshot_seconds", 0.0
            )
            if value and value != last:
                self.taken.append((time.monotonic(), value))
                last = value
            await asyncio.sleep(0.2)

    def window(self, run: Run, lag: LagSampler) -> tuple[float, float]:
        if not self.taken:
            return 0.0, 0.0
        end, seconds = self.taken[0]
        return end - seconds, end

    def report(self) -> dict[str, Any]:
        return {
            "probe": self.name,
            "snapshot_every_s": self.every_s,
            "snapshots": [
                {"started_at_s": round(end - s - self.t0, 2), "seconds": round(s, 3)}
                for end, s in self.taken
            ],
        }


@dataclass
class Failover:
    """A leader and a standby; the leader is SIGKILLed (its lock stays until its TTL ends)."""

    name: str = "failover"
    leader: Indexer | None = None
    t_kill: float = 0.0
    t_lead: float = 0.0
    t_recovered: float = 0.0

    async def prepare(self, run: Run) -> None:
        run.env.stop_indexers()
        self.leader, _standby = await run.env.start_indexers(2, "--snapshot-every", "0")

    async def act(self, run: Run, t0: float, seconds: float) -> None:
        assert self.leader is not None and run.cpu is not None
        await _until(t0 + AT * seconds)
        shard = (await run.env.read_index()).shards[0]
        key = shard.keys.leader(0)
        held_by = await shard.call("GET", key)
        run.cpu.sample()
        self.t_kill = time.monotonic()
        run.env.kill_indexer(self.leader)
        run.env.indexers = {n: ix for n, ix in run.env.indexers.items() if ix is not self.leader}
        deadline = self.t_kill + 120
        while time.monotonic() < deadline:
            now = await shard.call("GET", key)
            if now is not None and now != held_by:
                self.t_lead = time.monotonic()
                return
            await asyncio.sleep(0.01)

    def window(self, run: Run, lag: LagSampler) -> tuple[float, float]:
        after = [t for t, ms in lag.samples if t >= self.t_lead and ms <= RECOVERED_LAG_MS]
        self.t_recovered = after[0] if after and self.t_lead else 0.0
        return self.t_kill, self.t_recovered or time.monotonic()

    def report(self) -> dict[str, Any]:
        return {
            "probe": self.name,
            "standby_leads_after_s": round(self.t_lead - self.t_kill, 2) if self.t_lead else None,
            "lag_under_100ms_after_s": (
                round(self.t_recovered - self.t_kill, 2) if self.t_recovered else None
            ),
        }


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)
