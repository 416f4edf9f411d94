"""The closed loop with real processes: frontend -> metrics -> planner -> decisions -> local
connector -> mocker worker processes, up under a load ramp and back down after it, and every
request of the run answered in full."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from base.connect import connect_nats
from infra.command import cli_command
from schemas import ScalingDecided, ScalingStatus, Subjects, decode
from tests.support.fleet import Fleet
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

M = "jetfleet-tiny"
MAX_TOKENS = 24


class Scaling:
    """Every decision and connector status of the fleet, as they are published."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.decisions: list[ScalingDecided] = []
        self.statuses: list[ScalingStatus] = []

    async def __aenter__(self) -> Scaling:
        self.nc = await connect_nats(self.fleet.nats_url, name="test-scaling")
        s = Subjects(self.fleet.prefix)

        async def on_decision(msg) -> None:
            self.decisions.append(decode(msg.data, ScalingDecided))

        async def on_status(msg) -> None:
            self.statuses.append(decode(msg.data, ScalingStatus))

        await self.nc.subscribe(s.scale_model(M), cb=on_decision)
        await self.nc.subscribe(s.scale_status(M, "agg"), cb=on_status)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.nc.close()

    def applied(self, up: bool) -> list[ScalingStatus]:
        ids = {
            d.decision_id
            for d in self.decisions
            if (d.desired_replicas > d.current_replicas) == up and d.changed
        }
        return [s for s in self.statuses if s.state == "applied" and s.decision_id in ids]


def connector_fleet(nats_server, tmp_path, *worker_args: str) -> Fleet:
    """A fleet whose one initial worker the local connector starts (and scales)."""
    fleet = Fleet(nats_server.url, tmp_path / "logs")
    fleet.group.start(
        "connector",
        cli_command(
            "connector", "local", *fleet.common(), "--initial", "agg=1",
            "--log-dir", str(tmp_path / "workers"), *worker_args,
        ),
    )  # fmt: skip
    return fleet


async def one(client: httpx.AsyncClient, fleet: Fleet, i: int) -> dict:
    r = await client.post(
        f"{fleet.base_url}/v1/completions",
        json={
            "model": M,
            "prompt": f"request {i}: " + "lorem ipsum " * 20,
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
        },
    )
    assert r.status_code == 200, r.text
    return r.json()


async def paced(client: httpx.AsyncClient, fleet: Fleet, rps: float, seconds: float) -> list:
    tasks = []
    start = time.monotonic()
    n = int(rps * seconds)
    for i in range(n):
        await asyncio.sleep(max(0.0, start + i / rps - time.monotonic()))
        tasks.append(asyncio.create_task(one(client, fleet, i)))
    return tasks


async def test_planner_scales_real_workers_up_and_down_without_losing_requests(
    nats_server, tmp_path
) -> None:
    fleet = connector_fleet(nats_server, tmp_path, "--speedup", "10")
    try:
        fleet.start_frontend("--router", "least-loaded")
        # one replica decodes 150 tokens/s by this profile: 12 rps x 24 tokens needs 2
        fleet.group.start(
            "planner",
            cli_command(
                "planner", *fleet.common(), "--model", M, "--interval", "1",
                "--predictor", "constant", "--scale-up-cooldown", "2",
                "--scale-down-cooldown", "3", "--max-replicas", "agg=3",
                "--set", "profile.decode_tokens_per_s=150",
                "--set", "profile.prefill_tokens_per_s=1000000",
            ),
        )  # fmt: skip
        async with Scaling(fleet) as scaling, httpx.AsyncClient(timeout=60) as client:
            tasks = await paced(client, fleet, 12.0, 6.0)
            await wait_for(lambda: scaling.applied(up=True), timeout=30)
            tasks += await paced(client, fleet, 1.0, 4.0)  # the trickle runs into the drain
            down = await wait_for(lambda: scaling.applied(up=False), timeout=40)
            tasks += await paced(client, fleet, 1.0, 2.0)
            results = await asyncio.gather(*tasks)
        up = scaling.applied(up=True)
        assert max(s.replicas for s in up) >= 2
        assert "drained" in down[0].detail
        assert not [s for s in scaling.statuses if s.state == "failed"]
        assert len(results) == 12 * 6 + 4 + 2
        for r in results:
            assert r["usage"]["completion_tokens"] == MAX_TOKENS
            assert r["choices"][0]["finish_reason"] == "length"
    finally:
        fleet.stop()


async def test_load_mode_reacts_to_measured_queueing(nats_server, tmp_path) -> None:
    """``--mode load``: no capacity profile, only what the workers report. Sustained load
    queues on the one worker (2 slots), the planner adds a replica; once idle, it takes it
    away."""
    fleet = connector_fleet(nats_server, tmp_path, "--speedup", "1", "--max-num-seqs", "2")
    try:
        # the queue is the signal here, not a reason to shed: on a busy machine the second
        # replica can come after the burst has queued past the default bound (2 + 64)
        fleet.start_frontend("--router", "least-loaded", "--max-waiting-per-worker", "1000")
        fleet.group.start(
            "planner",
            cli_command(
                "planner", *fleet.common(), "--model", M, "--interval", "1", "--mode", "load",
                "--scale-up-cooldown", "1", "--scale-down-cooldown", "2",
                "--max-replicas", "agg=2", "--set", "load_queue_high=1",
            ),
        )  # fmt: skip
        async with Scaling(fleet) as scaling, httpx.AsyncClient(timeout=90) as client:
            burst = await paced(client, fleet, 20.0, 6.0)  # beyond 2 slots at real time
            up = await wait_for(lambda: scaling.applied(up=True), timeout=30)
            results = await asyncio.gather(*burst)
            await wait_for(lambda: scaling.applied(up=False), timeout=40)
        assert up[0].replicas == 2
        modes = {d.mode for d in scaling.decisions}
        assert modes == {"load"}, modes
        grew = next(d for d in scaling.decisions if d.desired_replicas > d.current_replicas)
        assert any("above threshold" in r for r in grew.reasons), grew.reasons
        assert all(r["usage"]["completion_tokens"] == MAX_TOKENS for r in results)
        assert not [s for s in scaling.statuses if s.state == "failed"]
    finally:
        fleet.stop()


async def test_a_worker_started_by_hand_never_leaves_the_fleet_below_its_minimum(
    nats_server, tmp_path
) -> None:
    """The connector owns one worker (the minimum); someone starts a second by hand. Idle, the
    planner would scale two down to one: it must keep the owned one (the hand-started worker
    counts as capacity, not towards the minimum), so when the hand-started one goes, the model
    is still served at once."""
    fleet = connector_fleet(nats_server, tmp_path, "--speedup", "10")
    try:
        fleet.start_frontend("--router", "round-robin")
        fleet.group.start(
            "planner",
            cli_command(
                "planner", *fleet.common(), "--model", M, "--interval", "1",
                "--predictor", "constant", "--scale-down-cooldown", "0",
                "--min-replicas", "agg=1",
            ),
        )  # fmt: skip
        async with Scaling(fleet) as scaling, httpx.AsyncClient(timeout=30) as client:
            by_hand = fleet.add_worker("--speedup", "10")

            def with_both() -> list[ScalingDecided]:
                return [d for d in scaling.decisions if d.current_replicas == 2]

            seen = await wait_for(lambda: len(with_both()) >= 4 and with_both(), timeout=30)
            for d in seen:
                assert (d.desired_replicas, d.unmanaged_replicas) == (2, 1), d.reasons
            assert seen[-1].reasons[-1] == "hold: at min 1 + 1 started by hand"
            assert not [s for s in scaling.statuses if s.state in ("applying", "applied")]
            fleet.terminate(by_hand)
            for i in range(5):  # the owned worker never left: served with no wait
                r = await one(client, fleet, i)
                assert r["usage"]["completion_tokens"] == MAX_TOKENS
    finally:
        fleet.stop()
