"""The workers' heartbeats as one process sees them: who is live, who joined and who is gone
(deleted, restarted under its id, or no heartbeat within its TTL, measured on this process's
clock). The planner asks it how many ready workers each (model, role) has right now; the indexer
asks it to say when a worker joins and when it is gone; ``jetfleet status`` lists them.

It reads ``fleet_heartbeats``. A watch that is a **judge** (the indexers and the planners run one)
also deletes the registration of a worker it found gone from ``fleet_workers``, and says every
second on ``fleet.judges`` that it is there: the frontends follow the registrations
(``worker_follow.FleetFollower``) and so hear a worker join and leave, not every heartbeat of
every worker (1,024 workers beat 1,024 times a second). Several judges may run: a deletion names
the revision it judged, so a worker that came back meanwhile is not deleted.

A worker counts while its heartbeat is fresh and its status is ``ready``; a draining worker is
already on its way out and does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import structlog
from nats.aio.client import Client as NATS
from nats.js.kv import KeyValue

from base.cancelling import cancel_and_wait
from base.kv_read import bucket_keys
from schemas import Subjects, WireDecodeError, WorkerRegistration, decode, encode
from schemas.discovery import BY_HAND
from schemas.streams import HEARTBEATS_BUCKET, WORKERS_BUCKET

log = structlog.get_logger("jetfleet.workers")

ORPHAN_SWEEP_S = 15.0  # how often a judge looks for registrations no heartbeat stands behind
_LISTING_TIMEOUT_S = 5.0  # a judge listing registrations gives up (the next sweep retries)


class Hearing:
    """Whether the workers' heartbeats reach this process at all, and since when. Pure.

    A worker is gone when no heartbeat came for its TTL. But on a NATS cluster the workers
    bucket can be without a stream leader for several seconds after a node is lost (an
    election), and then every worker's heartbeat fails at once: expiring them all would
    migrate every request to nowhere and drop live workers from the index. So while no
    heartbeat from any worker has arrived for most of a TTL (less ``slack_s``), the silence
    is the bucket's, not the workers', and nobody is expired, for at most ``max_deaf_s``;
    when heartbeats come again (``since``) each worker gets a full TTL from then to be
    heard. A worker that dies while others beat is expired after its TTL as before; when
    every worker dies at once (nothing to migrate to anyway) they expire after
    ``max_deaf_s`` (15 s: a JetStream election under load took up to 10 s here)."""

    def __init__(self, max_deaf_s: float = 15.0, slack_s: float = 1.5) -> None:
        self.max_deaf_s = max_deaf_s
        self.slack_s = slack_s  # > a heartbeat interval: beats of a live fleet land within it
        self.last_heard = float("-inf")
        self.since = float("-inf")  # when heartbeats came again after a deaf spell
        self.deaf = False

    def heard(self, now: float, joined: bool = False) -> None:
        """A heartbeat arrived; ``joined``: from a worker not known before (a replacement's
        first beat says nothing about the bucket carrying the others' beats)."""
        if joined and self.deaf:
            return
        if self.deaf:
            self.deaf = False
            self.since = now
            log.info("heartbeats_heard_again")
        self.last_heard = now

    def may_expire(self, now: float, ttl_s: float) -> bool:
        silent = now - self.last_heard
        # a fleet that is heard beats every heartbeat interval: silence for most of a TTL (all
        # workers' beats failing together, as when the bucket elects a leader) is deafness,
        # judged before the first of them is due, not after
        quiet = max(ttl_s - self.slack_s, self.slack_s)
        if self.last_heard == float("-inf") or silent <= quiet or silent > self.max_deaf_s:
            return True
        if not self.deaf:
            self.deaf = True
            log.warning("no_heartbeat_from_any_worker", silent_s=round(silent, 2))
        return False


def ready_counts(
    regs: dict[str, WorkerRegistration],
    model: str,
    roles: tuple[str, ...],
    now_s: float,
    unmanaged_only: bool = False,
) -> dict[str, int]:
    """Ready workers with a fresh heartbeat per role of ``model`` (every role in ``roles``);
    ``unmanaged_only``: only those started by hand (``managed_by == "hand"``; a worker older
    than the field says nothing and counts as managed, so an upgrade never shrinks a pool)."""
    counts = dict.fromkeys(roles, 0)
    for reg in regs.values():
        fresh = now_s - reg.heartbeat_at_s <= reg.ttl_s
        if unmanaged_only and reg.managed_by != BY_HAND:
            continue
        if reg.model == model and reg.status == "ready" and fresh and reg.role in counts:
            counts[reg.role] += 1
    return counts


def expired(
    live: Mapping[str, float],
    regs: Mapping[str, WorkerRegistration],
    now: float,
    heard_since: float = float("-inf"),
) -> list[str]:
    """Live workers (last heard at ``live[w]``, monotonic) not heard for their TTL, counting from
    ``heard_since`` at the earliest (when heartbeats could land again after an outage of the
    workers bucket); one without a registration is gone too. Pure."""
    return [
        worker_id
        for worker_id, seen in live.items()
        if (reg := regs.get(worker_id)) is None or now - max(seen, heard_since) > reg.ttl_s
    ]


class WorkerWatch:
    def __init__(
        self,
        nc: NATS,
        subjects: Subjects,
        on_joined: Callable[[str], None] | None = None,
        on_gone: Callable[[str], None] | None = None,
        expire_every_s: float = 1.0,
        on_heard: Callable[[WorkerRegistration], None] | None = None,
        judge: bool = False,
    ) -> None:
        """``judge``: delete the registrations of workers found gone, and say so on
        ``fleet.judges`` (an indexer's or a planner's watch)."""
        self.nc = nc
        self.judge = judge
        self.js = nc.jetstream()
        self.subjects = subjects
        self.regs: dict[str, WorkerRegistration] = {}
        self.live: dict[str, float] = {}  # worker -> when this process last saw it (monotonic)
        self.synced = asyncio.Event()
        self._on_joined = on_joined
        self._on_gone = on_gone
        self._on_heard = on_heard
        self._expire_every_s = expire_every_s
        self._tasks: list[asyncio.Task[None]] = []
        self._watcher: KeyValue.KeyWatcher | None = None
        self._registrations: KeyValue | None = None
        self._deleted: set[str] = set()  # registrations this judge deleted (or found gone)
        self.hearing = Hearing()

    async def start(self) -> None:
        kv = await self.js.key_value(self.subjects.bucket_name(HEARTBEATS_BUCKET))
        self._watcher = await kv.watchall()
        self._tasks.append(asyncio.create_task(self._watch(self._watcher)))
        if self._on_gone is not None or self.judge:
            self._tasks.append(asyncio.create_task(self._expire_loop()))
        if self.judge:
            self._registrations = await self.js.key_value(self.subjects.bucket_name(WORKERS_BUCKET))
            self._tasks.append(asyncio.create_task(self._judge_loop()))
        await self.synced.wait()

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        if self._watcher is not None:
            with contextlib.suppress(Exception):
                await self._watcher.stop()  # type: ignore[no-untyped-call]

    def counts(
        self, model: str, roles: tuple[str, ...], unmanaged_only: bool = False
    ) -> dict[str, int]:
        """Ready workers per role; while no worker at all is heard (``Hearing``: the bucket
        electing a leader) they are counted as when the fleet was last heard, so an interval
        that falls into the silence does not see an empty pool and start a second one."""
        now = time.monotonic()
        ttl = min((r.ttl_s for r in self.regs.values()), default=0.0)
        wall = time.time()
        if self.regs and not self.hearing.may_expire(now, ttl):
            wall -= now - self.hearing.last_heard  # judged as when the fleet was last heard
        return ready_counts(self.regs, model, roles, wall, unmanaged_only)

    def _gone(self, worker_id: str, why: str) -> None:
        if self.live.pop(worker_id, None) is None:
            return
        if why == "expired" and self.judge:
            self._spawn(self._unregister(worker_id, self.regs.get(worker_id)))
        if self._on_gone is not None:
            if why == "expired":
                log.warning("worker_expired", worker_id=worker_id)
            else:
                log.info("worker_gone", worker_id=worker_id, why=why)
            self._on_gone(worker_id)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.append(task)
        task.add_done_callback(self._forget_task)

    async def _restore(self, regs: list[WorkerRegistration], check: bool = True) -> None:
        """Put back the registration of a live worker that has none (a judge deleted it while
        the worker's heartbeats did not arrive, and the worker outlived that). At the judge's
        start every live worker is checked (one listing of the bucket); after, only a worker
        whose registration this judge deleted, when its heartbeats come again (``check`` False:
        no listing, so a join costs nothing more at any fleet size)."""
        if self._registrations is None:
            return
        present: set[str] = set()
        if check:
            with contextlib.suppress(Exception):  # NATS away: a create below fails if present
                present = await bucket_keys(self._registrations, timeout_s=_LISTING_TIMEOUT_S)
        for reg in regs:
            if reg.worker_id in self.live and reg.worker_id not in present:
                with contextlib.suppress(Exception):
                    await self._registrations.create(reg.worker_id, encode(reg))
                    log.info("worker_registration_restored", worker_id=reg.worker_id)

    def _forget_task(self, task: asyncio.Task[None]) -> None:
        with contextlib.suppress(ValueError):
            self._tasks.remove(task)

    async def _unregister(self, worker_id: str, reg: WorkerRegistration | None) -> None:
        """Delete the registration of a worker judged gone, unless it is a newer process's, or
        the worker was heard again meanwhile (a worker stalled for just over its TTL: a pause,
        a stopped process, a starved core). Heard again after the read, before the deletion
        landed, it is put back at once: its join came before the deletion, and no later one
        would (the registration was gone until its own refresh, 5 minutes)."""
        if self._registrations is None:
            return
        try:
            entry = await self._registrations.get(worker_id)
        except Exception:  # already gone (deregistered, another judge)
            self._deleted_or_restore(worker_id)
            return
        if worker_id in self.live:
            return  # heard again while the registration was read
        try:
            current = decode(entry.value or b"", WorkerRegistration)
        except WireDecodeError:
            current = None
        if current is not None and reg is not None and current.started_at_s > reg.started_at_s:
            return  # restarted meanwhile under the same id
        with contextlib.suppress(Exception):  # another judge was first
            await self._registrations.delete(worker_id, last=entry.revision)
            log.info("worker_registration_deleted", worker_id=worker_id, why="no heartbeat")
        self._deleted_or_restore(worker_id)

    def _deleted_or_restore(self, worker_id: str) -> None:
        """After a deletion: put the registration back if the worker is live again, else
        remember it, to put it back when the worker is heard (``_watch``)."""
        if worker_id in self.live and (reg := self.regs.get(worker_id)) is not None:
            self._spawn(self._restore([reg], check=False))
        else:
            self._deleted.add(worker_id)

    async def _judge_loop(self) -> None:
        """Say every second that a judge is there; and delete registrations no heartbeat
        stands behind (a worker that died while no judge ran) once a TTL has passed."""
        started = swept = time.monotonic()
        subject = self.subjects.judges()
        while True:
            with contextlib.suppress(Exception):
                await self.nc.publish(subject, b"")
            await asyncio.sleep(1.0)
            now = time.monotonic()
            ttl = max((r.ttl_s for r in self.regs.values()), default=4.0)
            if now - started < 2 * ttl or now - swept < ORPHAN_SWEEP_S:
                continue
            swept = now
            if not self.hearing.may_expire(now, ttl):
                continue
            self._spawn(self._sweep_orphans())  # a slow listing must not hold the presence

    async def _sweep_orphans(self) -> None:
        """Delete the registrations of workers that are not live: no heartbeat this judge hears
        (a worker that died before it started, or whose deletion was missed)."""
        if self._registrations is None:
            return
        try:
            registered = await bucket_keys(self._registrations, timeout_s=_LISTING_TIMEOUT_S)
        except Exception as exc:  # NATS slow or away: the next sweep reads it again
            log.warning("orphan_sweep_unread", error=repr(exc))
            return
        for key in registered:
            if key not in self.live:
                await self._unregister(key, self.regs.get(key))

    async def _watch(self, watcher: KeyValue.KeyWatcher) -> None:
        async for entry in watcher:
            if entry is None:
                if self.judge and not self.synced.is_set():
                    self._spawn(self._restore(list(self.regs.values())))
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
            old = self.regs.get(entry.key)
            self.regs[entry.key] = reg
            if time.time() - reg.heartbeat_at_s > reg.ttl_s:
                continue  # a stale entry left by a dead worker
            if old is not None and entry.key in self.live and old.started_at_s != reg.started_at_s:
                self._gone(entry.key, "restarted")  # a new process under the same id
            known = entry.key in self.live
            self.live[entry.key] = time.monotonic()
            self.hearing.heard(self.live[entry.key], joined=not known)
            if self._on_heard is not None:
                self._on_heard(reg)
            if not known and self._on_gone is not None:  # a watch that follows who comes and goes
                log.info("worker_joined", worker_id=reg.worker_id, model=reg.model, role=reg.role)
            if not known and self._on_joined is not None:
                self._on_joined(entry.key)
            if not known and entry.key in self._deleted:
                self._deleted.discard(entry.key)
                self._spawn(self._restore([reg], check=False))

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(self._expire_every_s)
            now = time.monotonic()
            gone = expired(self.live, self.regs, now, self.hearing.since)
            if gone and self.hearing.may_expire(now, min(r.ttl_s for r in self.regs.values())):
                for worker_id in gone:
                    self._gone(worker_id, "expired")
