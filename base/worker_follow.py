"""The registrations as a frontend follows them: a worker joins, changes (status, adapters),
restarts or leaves, and nothing more, whatever the fleet's size.

Workers put their registration in ``fleet_workers`` when it changes and every 5 min; their
heartbeats go to ``fleet_heartbeats``, which the judges of liveness read (the indexers, the
planners: ``worker_watch.WorkerWatch(judge=True)``). A judge deletes the registration of a worker
whose heartbeats stopped (and puts back the registration of a worker whose heartbeats come again),
and the follower hears that deletion as the worker's departure. So a frontend hears a fleet of
1,024 idle workers about 3.4 times a second (the refreshes) instead of 1,024 (every heartbeat).

A fleet may run without a judge (no kv router, no planner): while no judge has said it is there
(``fleet.judges``, every second) for ``judge_timeout_s``, the follower judges by itself, reading
the heartbeats as every frontend did before (a ``WorkerWatch`` of its own); when a judge is
heard again it stops. It starts judging, so a frontend is never without one at its start.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog
from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription
from nats.js.kv import KeyValue

from base.cancelling import cancel_and_wait
from base.worker_watch import WorkerWatch
from schemas import Subjects, WireDecodeError, WorkerRegistration, decode
from schemas.streams import WORKERS_BUCKET

log = structlog.get_logger("jetfleet.workers")


class FleetFollower:
    def __init__(
        self,
        nc: NATS,
        subjects: Subjects,
        on_heard: Callable[[WorkerRegistration], None],
        on_gone: Callable[[str], None],
        on_joined: Callable[[str], None] = lambda _w: None,
        expire_every_s: float = 0.25,
        judge_timeout_s: float = 3.0,
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.subjects = subjects
        self.regs: dict[str, WorkerRegistration] = {}
        self.live: set[str] = set()
        self.synced = asyncio.Event()
        self._on_heard = on_heard
        self._on_gone = on_gone
        self._on_joined = on_joined
        self._expire_every_s = expire_every_s
        self.judge_timeout_s = judge_timeout_s
        self.judge_heard = float("-inf")
        self.own_judge: WorkerWatch | None = None  # while no judge is heard
        self._watcher: KeyValue.KeyWatcher | None = None
        self._sub: Subscription | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self._judge(True)  # until a judge is heard
        kv = await self.js.key_value(self.subjects.bucket_name(WORKERS_BUCKET))
        self._watcher = await kv.watchall()
        self._sub = await self.nc.subscribe(self.subjects.judges(), cb=self._on_judge)
        self._tasks += [
            asyncio.create_task(self._watch(self._watcher)),
            asyncio.create_task(self._judge_loop()),
        ]
        await self.synced.wait()

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        await self._judge(False)
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        if self._watcher is not None:
            with contextlib.suppress(Exception):
                await self._watcher.stop()  # type: ignore[no-untyped-call]

    # ------------------------------------------------------------------ registrations
    def _gone(self, worker_id: str, why: str) -> None:
        if worker_id in self.live:
            self.live.discard(worker_id)
            log.info("worker_gone", worker_id=worker_id, why=why)
            self._on_gone(worker_id)

    def _heard(self, reg: WorkerRegistration) -> None:
        key = reg.worker_id
        old = self.regs.get(key)
        self.regs[key] = reg
        if old is not None and key in self.live and old.started_at_s != reg.started_at_s:
            self._gone(key, "restarted")  # a new process under the same id
        known = key in self.live
        self.live.add(key)
        self._on_heard(reg)
        if not known:
            log.info("worker_joined", worker_id=key, model=reg.model, role=reg.role)
            self._on_joined(key)

    async def _watch(self, watcher: KeyValue.KeyWatcher) -> None:
        async for entry in watcher:
            if entry is None:
                self.synced.set()
                continue
            if entry.operation in ("DEL", "PURGE") or not entry.value:
                self.regs.pop(entry.key, None)
                self._gone(entry.key, "deregistered")
                continue
            try:
                reg = decode(entry.value, WorkerRegistration)
            except WireDecodeError as exc:
                log.warning("bad_registration", key=entry.key, error=str(exc))
                continue
            own = self.own_judge
            if own is not None and entry.key not in own.live and own.synced.is_set():
                self.regs[entry.key] = reg  # judging alone: its heartbeats say whether it lives
                continue
            self._heard(reg)

    # ------------------------------------------------------------------ judging alone
    async def _on_judge(self, _msg: object) -> None:
        self.judge_heard = time.monotonic()

    def _judged_gone(self, worker_id: str) -> None:
        self._gone(worker_id, "expired")

    async def _judge(self, on: bool) -> None:
        if on and self.own_judge is None:
            watch = WorkerWatch(
                self.nc,
                self.subjects,
                on_gone=self._judged_gone,
                expire_every_s=self._expire_every_s,
                on_heard=self._heard,
            )
            self.own_judge = watch
            await watch.start()
            for worker_id in [w for w in self.live if w not in watch.live]:
                self._gone(worker_id, "expired")  # no heartbeat stands behind it
            log.info("judging_workers_alone", why="no judge heard")
        elif not on and self.own_judge is not None:
            watch, self.own_judge = self.own_judge, None
            await watch.stop()
            log.info("judging_workers_left_to_a_judge")

    async def _judge_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            silent = time.monotonic() - self.judge_heard > self.judge_timeout_s
            try:
                await self._judge(silent)
            except Exception as exc:  # NATS away: the next round tries again
                log.warning("judging_alone_failed", error=str(exc))
