"""The planner service against a real nats-server: metrics in, decisions out, restart, replay."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from prometheus_client import CollectorRegistry

from base.topology import ensure_topology
from base.worker_watch import WorkerWatch
from planner.capacity import CapacityProfile
from planner.config import PlannerConfig
from planner.replay import replay_planner
from planner.service import PlannerService, PlannerServiceConfig
from schemas import (
    DeadLetter,
    HeldRequests,
    RequestObservation,
    ScalingDecided,
    WorkerLoad,
    decode,
    encode,
)
from schemas.streams import HEARTBEATS_BUCKET, WORKERS_BUCKET
from tests.support.builders import registration
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

MODEL = "tiny"
PLANNER = PlannerConfig(
    adjustment_interval_s=0.5,
    predictor="constant",
    profile=CapacityProfile(prefill_tokens_per_s=1e6, decode_tokens_per_s=500.0),
    scale_up_cooldown_s=0.0,
    scale_down_cooldown_s=0.0,
)


class Planner:
    def __init__(self, nc, subjects, dry_run: bool = False) -> None:
        self.cfg = PlannerServiceConfig(
            nats_url="", subjects=subjects, model=MODEL, planner=PLANNER, dry_run=dry_run
        )
        self.nc = nc
        self.watch = WorkerWatch(nc, subjects)
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.service: PlannerService | None = None

    async def __aenter__(self) -> PlannerService:
        await self.watch.start()
        self.service = PlannerService(self.cfg, self.nc, self.watch, CollectorRegistry())
        ready = asyncio.Event()
        self.task = asyncio.create_task(self.service.run(self.stop, ready))
        await asyncio.wait_for(ready.wait(), 10)
        return self.service

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 10)
        await self.watch.stop()


async def register(js, subjects, worker_id: str, managed_by: str = "local") -> None:
    """A worker as a connector starts it (``managed_by="hand"``: one started by hand): its
    registration and its heartbeat."""
    reg = registration(
        worker_id,
        MODEL,
        max_num_seqs=64,
        num_gpu_blocks=1000,
        heartbeat_at_s=time.time(),
        ttl_s=60.0,
        managed_by=managed_by,
    )
    for bucket in (WORKERS_BUCKET, HEARTBEATS_BUCKET):
        kv = await js.key_value(subjects.bucket_name(bucket))
        await kv.put(worker_id, encode(reg))


async def send_load(js, subjects, n: int, osl: int = 40) -> None:
    for i in range(n):
        obs = RequestObservation(
            f"r{time.monotonic_ns()}-{i}",
            MODEL,
            "ok",
            time.time(),
            isl_tokens=300,
            osl_tokens=osl,
            ttft_s=0.05,
            itl_s=0.01,
        )
        await js.publish(subjects.obs(MODEL), encode(obs))
    load = WorkerLoad("w0", MODEL, "agg", time.time(), 10, 3, 64, 0.5, 1000)
    await js.publish(subjects.metrics(MODEL, "agg", "w0"), encode(load))


@pytest.fixture
async def decisions(nc, subjects):
    await ensure_topology(nc.jetstream(), subjects)
    got: list[ScalingDecided] = []

    async def on(msg) -> None:
        got.append(decode(msg.data, ScalingDecided))

    sub = await nc.subscribe(subjects.scale_model(MODEL), cb=on)
    yield got
    with contextlib.suppress(Exception):
        await sub.unsubscribe()


async def test_metrics_in_decisions_out_restart_and_exact_replay(nc, subjects, decisions) -> None:
    js = nc.jetstream()
    await register(js, subjects, "w0")
    t0 = time.time() - 1
    async with Planner(nc, subjects) as planner:
        await send_load(js, subjects, 60)  # 120 rps x 40 tokens = 4800 tok/s: 10 replicas
        up = await wait_for(lambda: [d for d in decisions if d.desired_replicas > 1], 10)
        assert up[0].current_replicas == 1
        assert 1 < up[0].desired_replicas <= PLANNER.default_max_replicas
        assert any("needs" in r for r in up[0].reasons)
        assert up[0].metrics_last_seq > up[0].metrics_after_seq
        assert up[0].planner_state and up[0].planner_config
        await wait_for(lambda: planner.intervals >= 3, 10)  # idle intervals: holds
    first_run = len(decisions)
    assert all(d.role == "agg" and not d.dry_run for d in decisions)

    # a restarted planner continues the decision ids and its state
    await send_load(js, subjects, 10)
    async with Planner(nc, subjects) as planner:
        await wait_for(lambda: planner.intervals >= 2, 10)
    ids = [d.decision_id for d in decisions]
    assert ids == list(range(ids[0], ids[0] + len(ids))), ids
    assert len(decisions) > first_run

    report = await replay_planner(js, subjects, MODEL, t0, time.time() + 1)
    assert report.intervals == len(decisions)
    assert report.differing == 0, [r.differences for r in report.rows if r.differences]
    assert report.messages == 60 + 1 + 10 + 1

    other = await replay_planner(
        js, subjects, MODEL, t0, time.time() + 1, ["profile.decode_tokens_per_s=1e6"]
    )
    assert max(r.replayed.desired for r in other.rows) == 1


async def test_dry_run_and_dead_letters(nc, subjects, decisions) -> None:
    js = nc.jetstream()
    await register(js, subjects, "w0")
    dead: list[DeadLetter] = []

    async def on_dead(msg) -> None:
        dead.append(decode(msg.data, DeadLetter))

    sub = await nc.subscribe(subjects.dlq("planner"), cb=on_dead)
    async with Planner(nc, subjects, dry_run=True):
        await js.publish(subjects.obs(MODEL), b"\x00not msgpack")
        await send_load(js, subjects, 60)
        up = await wait_for(lambda: [d for d in decisions if d.desired_replicas > 1], 10)
        assert up[0].dry_run
        await wait_for(lambda: dead, 5)
    await sub.unsubscribe()
    assert dead[0].subject == subjects.obs(MODEL)


async def test_a_new_planner_plans_from_now_not_from_history(nc, subjects, decisions) -> None:
    js = nc.jetstream()
    await register(js, subjects, "w0")
    t0 = time.time() - 1
    await send_load(js, subjects, 80)  # yesterday's traffic, as far as this planner knows
    async with Planner(nc, subjects) as planner:
        await wait_for(lambda: planner.intervals >= 2, 10)
    assert decisions and all(d.desired_replicas == 1 for d in decisions), decisions
    assert decisions[0].metrics_after_seq >= 81
    report = await replay_planner(js, subjects, MODEL, t0, time.time() + 1)
    assert report.differing == 0 and report.messages == 0


async def test_requests_a_frontend_holds_are_planned_for(nc, subjects, decisions) -> None:
    """Held in a frontend while every worker has a queue, they are in no worker's report: the
    planner reads the frontend's ``HeldRequests`` from the stream and sizes for them too."""
    js = nc.jetstream()
    await register(js, subjects, "w0")
    async with Planner(nc, subjects):
        for i in range(2):  # the requests' shape: 300 prompt tokens, 40 out
            obs = RequestObservation(
                f"r{i}", MODEL, "ok", time.time(), isl_tokens=300, osl_tokens=40, ttft_s=0.05
            )
            await js.publish(subjects.obs(MODEL), encode(obs))
        held = HeldRequests("frontend-1", MODEL, time.time(), {"agg": 40})
        await js.publish(subjects.held(MODEL, "frontend-1"), encode(held))
        up = await wait_for(
            lambda: [d for d in decisions if any("incl. 40 waiting" in r for r in d.reasons)], 10
        )
    assert up[0].desired_replicas > 1  # 40 held in one interval, 40 tokens each: several
