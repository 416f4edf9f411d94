"""Liveness: the judges read the heartbeats, the frontends follow the registrations.

A judge (``WorkerWatch(judge=True)``: indexers, planners) deletes the registration of a worker
whose heartbeats stopped; a frontend's ``FleetFollower`` hears that deletion as the departure, and
hears no heartbeat while a judge is about. Without one, it judges the heartbeats itself.
"""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from base.topology import ensure_topology
from base.worker_follow import FleetFollower
from base.worker_watch import WorkerWatch
from router.discovery import Discovery
from router.fleet_state import FleetState
from schemas import WorkerRegistration, decode, encode
from schemas.streams import HEARTBEATS_BUCKET, WORKERS_BUCKET
from tests.support.builders import registration
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


class Beating:
    """A fake worker: its registration, and a heartbeat every 0.2 s until stopped."""

    def __init__(self, js, subjects, worker_id: str) -> None:
        self.js, self.subjects, self.worker_id = js, subjects, worker_id
        self.reg = registration(
            worker_id, "m", heartbeat_interval_s=0.2, ttl_s=1.0, started_at_s=time.time()
        )
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.beats = await self.js.key_value(self.subjects.bucket_name(HEARTBEATS_BUCKET))
        self.regs = await self.js.key_value(self.subjects.bucket_name(WORKERS_BUCKET))
        await self.beat()
        await self.regs.put(self.worker_id, encode(self.reg))
        self.task = asyncio.create_task(self._loop())

    async def beat(self) -> None:
        fresh = msgspec.structs.replace(self.reg, heartbeat_at_s=time.time())
        await self.beats.put(self.worker_id, encode(fresh))

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            await self.beat()

    def stop(self) -> None:  # dies: no deregistration
        if self.task is not None:
            self.task.cancel()


@pytest.fixture
async def fleet(nc, subjects):
    await ensure_topology(nc.jetstream(), subjects)
    return nc, subjects


async def test_a_judge_deletes_a_silent_workers_registration_and_the_follower_hears_it(fleet):
    nc, subjects = fleet
    judge = WorkerWatch(nc, subjects, judge=True, expire_every_s=0.1)
    await judge.start()
    joined: list[str] = []
    gone: list[str] = []
    heard: list[WorkerRegistration] = []
    follower = FleetFollower(
        nc, subjects, on_heard=heard.append, on_gone=gone.append, on_joined=joined.append
    )
    await follower.start()
    w = Beating(nc.jetstream(), subjects, "w-silent")
    await w.start()
    try:
        await wait_for(lambda: joined == ["w-silent"], timeout=10)
        await wait_for(lambda: follower.own_judge is None, timeout=10)  # a judge is heard
        seen = len(heard)
        await asyncio.sleep(1.0)  # five heartbeats go by
        assert len(heard) == seen, "the follower heard heartbeats with a judge about"
        w.stop()
        await wait_for(lambda: gone == ["w-silent"], timeout=10)  # the judge deleted it
        regs = await nc.jetstream().key_value(subjects.bucket_name(WORKERS_BUCKET))
        with pytest.raises(Exception):  # noqa: B017 (nats-py raises KeyDeletedError/NotFound)
            await regs.get("w-silent")
    finally:
        w.stop()
        await follower.stop()
        await judge.stop()


async def test_without_a_judge_the_follower_judges_the_heartbeats_itself(fleet):
    nc, subjects = fleet
    gone: list[str] = []
    joined: list[str] = []
    follower = FleetFollower(
        nc, subjects, on_heard=lambda _r: None, on_gone=gone.append, on_joined=joined.append
    )
    await follower.start()
    w = Beating(nc.jetstream(), subjects, "w-alone")
    await w.start()
    try:
        await wait_for(lambda: joined == ["w-alone"], timeout=10)
        assert follower.own_judge is not None
        w.stop()
        await wait_for(lambda: gone == ["w-alone"], timeout=10)
    finally:
        w.stop()
        await follower.stop()


async def test_a_judge_leaves_a_restarted_workers_registration_alone(fleet):
    """The worker's old process went silent, a new one registered under its id meanwhile: the
    judge expires the old heartbeat but does not delete the new registration."""
    nc, subjects = fleet
    judge = WorkerWatch(nc, subjects, judge=True, expire_every_s=0.1)
    await judge.start()
    old = Beating(nc.jetstream(), subjects, "w-again")
    await old.start()
    try:
        await wait_for(lambda: "w-again" in judge.live, timeout=10)
        old.stop()
        regs = await nc.jetstream().key_value(subjects.bucket_name(WORKERS_BUCKET))
        new_reg = msgspec.structs.replace(old.reg, started_at_s=time.time() + 1)
        await regs.put("w-again", encode(new_reg))  # registered, first heartbeat not yet in
        await wait_for(lambda: "w-again" not in judge.live, timeout=10)
        await asyncio.sleep(0.3)  # the judge's deletion, had it made one
        assert (await regs.get("w-again")).value == encode(new_reg)
    finally:
        old.stop()
        await judge.stop()


async def test_a_judge_puts_back_the_registration_of_a_worker_whose_heartbeats_return(fleet):
    """A worker cut off for longer than its TTL loses its registration; when its heartbeats come
    again (the partition healed, the worker never restarted) the judge registers it again, so
    the frontends route to it without waiting for its next refresh."""
    nc, subjects = fleet
    judge = WorkerWatch(nc, subjects, judge=True, expire_every_s=0.1)
    await judge.start()
    w = Beating(nc.jetstream(), subjects, "w-cut")
    await w.start()
    regs = await nc.jetstream().key_value(subjects.bucket_name(WORKERS_BUCKET))

    async def registered() -> bool:
        try:
            return bool((await regs.get("w-cut")).value)
        except Exception:
            return False

    try:
        await wait_for(lambda: "w-cut" in judge.live, timeout=10)
        w.stop()  # the partition: no heartbeat arrives
        await wait_for(lambda: "w-cut" not in judge.live, timeout=10)

        async def unregistered() -> bool:
            return not await registered()

        await wait_for(unregistered, timeout=10)  # the judge deleted it
        w.task = asyncio.create_task(w._loop())  # healed: the same process beats again
        await wait_for(registered, timeout=10)  # the judge put it back
        back = decode((await regs.get("w-cut")).value, WorkerRegistration)
        assert back.worker_id == "w-cut" and back.started_at_s == w.reg.started_at_s
    finally:
        w.stop()
        await judge.stop()


@pytest.mark.parametrize("during", ["get", "delete"])
async def test_a_worker_heard_again_while_the_judge_deletes_it_stays_registered(fleet, during):
    """A worker stalled for just over its TTL (a CI run: SIGSTOPped by a test, then let go) is
    judged gone, and its heartbeat comes again while the judge reads (``get``) or deletes
    (``delete``) its registration: the registration is kept, or put back at once. (Before, its
    join came before the deletion and no later one did: the worker stayed out of every
    frontend's routing until its own refresh, 5 minutes later.)"""
    nc, subjects = fleet
    judge = WorkerWatch(nc, subjects, judge=True, expire_every_s=0.1)
    await judge.start()
    w = Beating(nc.jetstream(), subjects, f"w-{during}")
    await w.start()
    regs = await nc.jetstream().key_value(subjects.bucket_name(WORKERS_BUCKET))
    assert judge._registrations is not None
    real = getattr(judge._registrations, during)
    calls: list[str] = []

    async def as_the_worker_beats_again(key: str, **kw: object) -> object:
        if calls:
            return await real(key, **kw)
        w.task = asyncio.create_task(w._loop())  # the stalled worker runs again
        await wait_for(lambda: key in judge.live, timeout=10)  # heard before the call lands
        try:
            return await real(key, **kw)
        finally:
            calls.append(key)

    async def registered() -> bool:
        try:
            return bool((await regs.get(w.worker_id)).value)
        except Exception:
            return False

    try:
        await wait_for(lambda: w.worker_id in judge.live, timeout=10)
        setattr(judge._registrations, during, as_the_worker_beats_again)
        w.stop()  # stalled: no heartbeat for longer than its TTL
        await wait_for(lambda: calls, timeout=10)  # judged gone, and the judge's call landed
        await wait_for(registered, timeout=5)  # kept, or put back (not left to its refresh)
    finally:
        w.stop()
        await judge.stop()


async def test_discovery_tells_each_workers_joining_and_leaving_after_its_fleet_state(fleet):
    """What the frontend counts as ``jetfleet_frontend_worker_changes_total``."""
    nc, subjects = fleet
    state = FleetState()
    changes: list[tuple[str, str, bool]] = []  # worker, change, in the state when told
    discovery = Discovery(
        nc,
        subjects,
        state,
        on_worker_joined=lambda w: changes.append((w, "joined", w in state.workers)),
        on_worker_left=lambda w: changes.append((w, "left", w in state.workers)),
    )
    await discovery.start()
    w = Beating(nc.jetstream(), subjects, "w-churn")
    await w.start()
    try:
        await wait_for(lambda: changes == [("w-churn", "joined", True)], timeout=10)
        w.stop()
        await wait_for(lambda: len(changes) == 2, timeout=10)
        assert changes[1] == ("w-churn", "left", False)
    finally:
        w.stop()
        await discovery.stop()


async def test_a_judge_sweeps_registrations_no_heartbeat_stands_behind(fleet, monkeypatch):
    """A registration left by a worker that died before this judge started (its heartbeat long
    expired) is deleted by the judge's sweep; a live worker's stays, and the judge's presence
    goes on being published while the sweep lists the bucket."""
    import base.worker_watch as worker_watch

    monkeypatch.setattr(worker_watch, "ORPHAN_SWEEP_S", 0.5)
    nc, subjects = fleet
    js = nc.jetstream()
    regs = await js.key_value(subjects.bucket_name(WORKERS_BUCKET))
    await regs.put("w-orphan", encode(registration("w-orphan", "m", ttl_s=1.0)))
    live = Beating(js, subjects, "w-live")
    await live.start()
    judge = WorkerWatch(nc, subjects, judge=True, expire_every_s=0.1)
    presence = await nc.subscribe(subjects.judges())
    await judge.start()
    try:

        async def orphan_gone() -> bool:
            try:
                await regs.get("w-orphan")
            except Exception:  # deleted
                return True
            return False

        await wait_for(orphan_gone, timeout=15)
        assert decode((await regs.get("w-live")).value, WorkerRegistration).worker_id == "w-live"
        await presence.next_msg(timeout=3)
    finally:
        live.stop()
        await presence.unsubscribe()
        await judge.stop()
