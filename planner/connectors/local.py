"""The ``local`` connector: scaling decisions start and stop real worker processes here.

The connector owns the workers it starts (children in a ``ProcessGroup``, named
``{role}-{n}``, worker id ``{id_prefix}-{role}-{n}``). A decision is applied as a change of
``desired - now`` replicas of its role, where ``now`` is the role's ready workers in discovery
when the decision is applied plus its own workers still starting: decisions are applied one at a
time, so one taken while a worker was still loading (a real model: minutes) and applied after it
registered must not start another; workers started by someone else count but are never
touched.

- **Up**: start the missing workers and wait until each has registered as ready (``applied``)
  or one exits or ``start_timeout_s`` passes (``failed``, with the log tail). Given
  ``cpu_sets`` (``jetfleet up`` gives a CPU engine's slices), each runs on the slice fewest own
  workers run on: one started to meet a burst does not share the cores of the one serving it.
- **Down**: the newest own workers of the role (coldest caches; while some share a slice of
  cores, the newest on the most shared one: ``to_stop``) get SIGTERM and drain: status
  ``draining`` (routers stop sending), in-flight requests finish (past the worker's drain timeout
  the rest are aborted and the frontends migrate them), deregistration, exit. ``applied`` once
  they exited; a worker that outlives ``stop_timeout_s`` is killed (its requests migrate too).
  With fewer own workers than asked, it stops what it owns and reports ``failed`` with the
  shortfall.

``close`` drains every own worker: stopping the connector stops the workers it started.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from base.process import ProcessGroup
from base.worker_watch import WorkerWatch
from planner.connectors.base import ScaleResult
from schemas import ScalingDecided

log = structlog.get_logger("jetfleet.connector.local")


@dataclass(frozen=True)
class LocalScalerConfig:
    nats_url: str
    worker_command: tuple[str, ...]
    """The argv that starts a worker, without its flags (``jetfleet worker``, given by ``infra``:
    the planner does not name the command line above it)."""
    subject_prefix: str = "fleet"
    log_dir: Path = Path(".jetfleet/logs")
    worker_args: tuple[str, ...] = ()
    """Extra ``jetfleet worker`` arguments (engine, model, speedup...)."""
    id_prefix: str = "local"
    start_timeout_s: float = 60.0
    stop_timeout_s: float = 90.0
    """Longest wait for a draining worker before it is killed (keep above its drain timeout)."""
    log_level: str = "info"
    env: dict[str, str] = field(default_factory=dict)
    cpu_sets: tuple[str, ...] = ()
    """The cores each worker may be given (``--cpu-cores``, CPU lists): a started worker takes the
    one fewest own workers run on (none given: where the OS puts it)."""


def least_used(cpu_sets: Sequence[str], in_use: Iterable[str]) -> str:
    """Of ``cpu_sets``, the first that fewest of ``in_use`` (the sets of running workers) are."""
    used = Counter(in_use)
    return min(cpu_sets, key=lambda cores: used[cores])


def to_stop(own: Sequence[str], cores: Mapping[str, str], count: int) -> list[str]:
    """Which ``count`` of ``own`` (a role's workers, oldest first) to stop: the newest first
    (coldest caches), but while workers share a slice of cores (``cores``: the slice of each
    running worker, of every role), the newest on the most shared slice, so the ones left run on
    cores of their own. Pure."""
    left, chosen = list(own), []
    for _ in range(min(count, len(left))):
        shared = Counter(c for n, c in cores.items() if n not in chosen)
        newest_first = list(reversed(left))
        pick = max(newest_first, key=lambda n: shared.get(cores.get(n, ""), 0))
        if shared.get(cores.get(pick, ""), 0) <= 1:
            pick = newest_first[0]  # nothing shared: the coldest cache goes
        left.remove(pick)
        chosen.append(pick)
    return chosen


class LocalScaler:
    name = "local"

    def __init__(self, cfg: LocalScalerConfig, watch: WorkerWatch) -> None:
        self.cfg = cfg
        self.watch = watch
        self.group = ProcessGroup(cfg.log_dir)
        self.own: dict[str, list[str]] = {}
        self.cores: dict[str, str] = {}  # own worker (name) -> the cores it was given
        self._n = 0
        self.started = 0
        self.stopped = 0

    def owned(self, role: str) -> int:
        return len(self.own.get(role, []))

    def _argv(self, role: str, worker_id: str, cores: str | None) -> list[str]:
        return [
            *self.cfg.worker_command,
            "--nats",
            self.cfg.nats_url,
            "--subject-prefix",
            self.cfg.subject_prefix,
            "--log-level",
            self.cfg.log_level,
            "--role",
            role,
            "--worker-id",
            worker_id,
            "--managed-by",
            self.name,
            *self.cfg.worker_args,
            *(["--cpu-cores", cores] if cores is not None else []),
        ]

    async def start_workers(self, role: str, count: int) -> ScaleResult:
        names: list[str] = []
        for _ in range(count):
            name = f"{role}-{self._n}"
            self._n += 1
            worker_id = f"{self.cfg.id_prefix}-{name}"
            cores = None
            if self.cfg.cpu_sets:
                cores = least_used(self.cfg.cpu_sets, self.cores.values())
            self.group.start(name, self._argv(role, worker_id, cores), env=self.cfg.env)
            if cores is not None:
                self.cores[name] = cores
            self.own.setdefault(role, []).append(name)
            names.append(name)
            self.started += 1
        ids = {f"{self.cfg.id_prefix}-{n}" for n in names}
        deadline = time.monotonic() + self.cfg.start_timeout_s
        while time.monotonic() < deadline:
            dead = [c for c in self.group.exited() if c.name in names]
            if dead:
                tail = dead[0].log_path.read_text(errors="replace")[-1500:]
                for c in dead:
                    self._forget(role, c.name)
                    self.group.children.pop(c.name, None)
                return ScaleResult(False, self.owned(role), f"{dead[0].name} exited:\n{tail}")
            ready = {w for w in ids if (r := self.watch.regs.get(w)) and r.status == "ready"}
            if ready == ids:
                return ScaleResult(True, self.owned(role), f"started {', '.join(sorted(ids))}")
            await asyncio.sleep(0.1)
        return ScaleResult(
            False, self.owned(role), f"not registered after {self.cfg.start_timeout_s:.0f}s"
        )

    def _forget(self, role: str, name: str) -> None:
        self.cores.pop(name, None)
        with_role = self.own.get(role, [])
        if name in with_role:
            with_role.remove(name)

    async def stop_workers(self, role: str, count: int) -> ScaleResult:
        mine = self.own.get(role, [])
        chosen = to_stop(mine, self.cores, count)
        for name in chosen:
            mine.remove(name)
        try:
            codes = await asyncio.gather(
                *(asyncio.to_thread(self.group.stop, n, self.cfg.stop_timeout_s) for n in chosen)
            )
        finally:  # their cores are free once they have exited (or are no longer ours)
            for name in chosen:
                self.cores.pop(name, None)
        self.stopped += len(chosen)
        detail = ", ".join(f"{n} exit {c}" for n, c in zip(chosen, codes, strict=True))
        if len(chosen) < count:
            short = f"owns only {len(chosen)} of {count} {role} workers to stop"
            return ScaleResult(False, self.owned(role), f"{short}; {detail}".rstrip("; "))
        return ScaleResult(True, self.owned(role), f"drained {detail}")

    def prune_exited(self) -> list[str]:
        """Forget own workers that exited on their own (crashed, killed): not ours to drain."""
        gone = [c.name for c in self.group.exited()]
        for name in gone:
            self.group.children.pop(name, None)
            for role in self.own:
                self._forget(role, name)
        if gone:
            log.warning("workers_exited", names=gone)
        return gone

    def replicas_now(self, model: str, role: str) -> int:
        """The role's ready workers in discovery now, plus own workers still starting."""
        ready = self.watch.counts(model, (role,))[role]
        ids = {w for w, r in self.watch.regs.items() if r.status == "ready"}
        starting = [n for n in self.own.get(role, []) if f"{self.cfg.id_prefix}-{n}" not in ids]
        return ready + len(starting)

    async def scale(self, decision: ScalingDecided) -> ScaleResult:
        self.prune_exited()
        role = decision.role
        now = self.replicas_now(decision.model, role)
        delta = decision.desired_replicas - now
        if delta > 0:
            return await self.start_workers(role, delta)
        if delta < 0:
            return await self.stop_workers(role, -delta)
        return ScaleResult(True, self.owned(role), f"nothing to do: {now} {role} workers already")

    async def close(self) -> None:
        await asyncio.to_thread(self.group.stop_all, self.cfg.stop_timeout_s)
        self.own.clear()
        self.cores.clear()

    def stats(self) -> dict[str, Any]:
        return {"started": self.started, "stopped": self.stopped, "own": dict(self.own)}
