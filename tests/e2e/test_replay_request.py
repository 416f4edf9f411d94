"""``jetfleet replay request ID`` on a real fleet: every stream's view of one request, in order."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable

import httpx
import pytest

from base.connect import close_nats, connect_nats
from infra.command import cli_command
from infra.replay_request import request_timeline
from schemas import Request, RequestObservation, Subjects, TokenChunk
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


async def timeline_when(fleet, rid: str, t0: float, ready: Callable[[list], bool]) -> list:
    """The request's timeline, read again until ``ready`` says it holds what the test needs."""
    nc = await connect_nats(fleet.nats_url, name="test-replay")
    try:

        async def read():
            got = await request_timeline(nc.jetstream(), Subjects(fleet.prefix), rid, t0)
            return got if ready(got) else None

        return await wait_for(read, timeout=10)
    finally:
        await close_nats(nc)


async def test_timeline_of_an_n2_request(fleet) -> None:
    t0 = time.time() - 1
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.post(
            f"{fleet.base_url}/v1/completions",
            json={"model": "jetfleet-tiny", "prompt": "tell me", "max_tokens": 5, "n": 2},
        )
    assert r.status_code == 200, r.text
    rid = r.json()["id"]
    entries = await timeline_when(
        fleet, rid, t0, lambda got: sum(isinstance(e.message, RequestObservation) for e in got) == 2
    )
    routed = [e for e in entries if isinstance(e.message, Request)]
    assert {e.message.request_id for e in routed} == {f"{rid}-0", f"{rid}-1"}
    assert all("routed to worker" in e.summary for e in routed)
    finals = [e for e in entries if isinstance(e.message, TokenChunk) and e.message.finish_reason]
    assert len(finals) == 2
    obs = [e for e in entries if isinstance(e.message, RequestObservation)]
    assert all("round-robin chose" in e.summary for e in obs)
    assert [e.time_s for e in entries] == sorted(e.time_s for e in entries)
    assert entries.index(routed[0]) < entries.index(finals[0])

    out = await asyncio.to_thread(
        subprocess.run,
        cli_command(
            "replay", "request", rid, "--nats", fleet.nats_url, "--subject-prefix", fleet.prefix
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "routed to worker" in out.stdout and "finish length" in out.stdout
    missing = await asyncio.to_thread(
        subprocess.run,
        cli_command(
            "replay", "request", "nope", "--nats", fleet.nats_url, "--subject-prefix", fleet.prefix
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 1 and "nothing recorded" in missing.stdout


async def test_replay_traffic_sends_recorded_requests_again(fleet) -> None:
    from infra.replay_traffic import replay_traffic, summary

    t0 = time.time() - 0.5
    async with httpx.AsyncClient(timeout=30) as client:
        for i in range(4):
            r = await client.post(
                f"{fleet.base_url}/v1/completions",
                json={"model": "jetfleet-tiny", "prompt": f"again {i}", "max_tokens": 6},
            )
            assert r.status_code == 200, r.text
            await asyncio.sleep(0.2)
    t1 = time.time() + 0.5
    s = Subjects(fleet.prefix)
    report = await replay_traffic(
        fleet.nats_url, s, fleet.nats_url, s, t0, t1, 4.0, "round-robin", None
    )
    out = summary(report)
    assert out["recorded_requests"] == 4 and out["replayed"] == 4 and out["errors"] == 0
    assert all(r.tokens == 6 and r.request_id.endswith(f"-replay-{k}")
               for k, r in enumerate(report.replayed))  # fmt: skip
    # 0.6 s of recorded spacing at 4x, plus generation: ~0.3 s idle; a loaded machine stretches
    # both the recorded spacing (each request's own time is in it) and the replayed requests
    # (still under the 5 s a replay waiting for a worker would take)
    assert 0.0 < report.wall_s < 4.0
    assert len(report.recorded_ttft_s) == 4


async def test_sampling_parameters_travel_on_the_wire(fleet) -> None:
    """top_k, min_p and the penalties reach the worker's Request as sent (vLLM applies them)."""
    t0 = time.time() - 1
    sampling = {
        "top_k": 40,
        "min_p": 0.05,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.1,
    }
    async with httpx.AsyncClient(timeout=30) as client:
        body = {"model": "jetfleet-tiny", "prompt": "sample", "max_tokens": 3, **sampling}
        r = await client.post(f"{fleet.base_url}/v1/completions", json=body)
    assert r.status_code == 200, r.text
    rid = r.json()["id"]
    entries = await timeline_when(
        fleet, rid, t0, lambda got: any(isinstance(e.message, Request) for e in got)
    )
    (request,) = [e.message for e in entries if isinstance(e.message, Request)]
    assert {k: getattr(request.sampling, k) for k in sampling} == sampling
