"""The planner on real engines: ``jetfleet up --engine vllm`` autoscaled in load mode (what
vLLM's scheduler reports: running and waiting requests, KV usage). A burst beyond one tiny-Llama
worker's two slots scales the fleet up (a real cold start of vLLM) and, once idle, back down
(drained), and every request of the run is answered in full. (The burst is sized against one
worker's speed on an idle machine: with 10 requests a second of 48 tokens, a one-thread worker
kept up and the planner rightly held.) Sized for the two engines the planner may run
(``--cpu-threads 1``): two engines of two threads on the two cores served this burst three times
slower beside two busy processes, and in a CI run one request of it took over 300 s. Unpinned
(``--cpu-cores none``), as the shared fleet runs: beside the suite's other busy workers an engine
pinned to one core cannot leave it (this burst: 22-28 s pinned, 10 s not, beside two busy
processes); the connector's placement is tested in ``test_local_connector.py``, the pin itself in
``test_cpu_placement.py``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from base.connect import close_nats, connect_nats
from schemas import ScalingDecided, ScalingStatus, Subjects, decode
from tests.support.up import Up, running_up
from tests.support.wait import wait_for
from tests.vllm_engine.conftest import START_TIMEOUT_S

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

M = "jetfleet-tiny-llama"
MAX_TOKENS = 96  # ~0.3 s a request here: two slots serve ~7 a second, the burst sends 20


@pytest.fixture(scope="module")
def autoscaled(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with running_up(
        tmp_path_factory.mktemp("autoscaled"), 1, "--engine", "vllm", "--model", str(tiny_llama),
        "--max-model-len", "1024", "--max-num-seqs", "2", "--router", "least-loaded",
        "--mode", "load", "--interval", "1", "--scale-up-cooldown", "1", "--cpu-threads", "1",
        "--cpu-cores", "none",
        "--scale-down-cooldown", "2", "--max-replicas", "agg=2", "--set", "load_queue_high=1",
        start_timeout_s=START_TIMEOUT_S, planner=True,
    ) as fleet:  # fmt: skip
        yield fleet


async def _one(client: httpx.AsyncClient, url: str, i: int) -> dict[str, Any]:
    r = await client.post(
        f"{url}/v1/completions",
        json={"model": M, "prompt": f"request {i}: " + "lorem ipsum " * 10,
              "max_tokens": MAX_TOKENS, "ignore_eos": True},
    )  # fmt: skip
    assert r.status_code == 200, r.text
    return dict(r.json())


async def test_a_burst_scales_real_workers_up_and_back_down(autoscaled: Up) -> None:
    decisions: list[ScalingDecided] = []
    statuses: list[ScalingStatus] = []
    nc = await connect_nats(autoscaled.nats_url, name="test-scaling")
    s = Subjects()
    await nc.subscribe(s.scale_model(M), cb=partial(_append, decisions, ScalingDecided))
    await nc.subscribe(s.scale_status(M, "agg"), cb=partial(_append, statuses, ScalingStatus))

    def applied(up: bool) -> list[ScalingStatus]:
        ids = {
            d.decision_id
            for d in decisions
            if d.changed and (d.desired_replicas > d.current_replicas) == up
        }
        return [st for st in statuses if st.state == "applied" and st.decision_id in ids]

    try:
        async with httpx.AsyncClient(timeout=300) as client:
            start, burst = time.monotonic(), []
            for i in range(60):  # 20 a second for 3 s: far beyond two slots, however fast
                await asyncio.sleep(max(0.0, start + i / 20 - time.monotonic()))
                burst.append(asyncio.create_task(_one(client, autoscaled.base_url, i)))
            try:
                up = await wait_for(lambda: applied(up=True), timeout=START_TIMEOUT_S)
            except AssertionError as e:  # say what the planner saw and did
                seen = [(d.current_replicas, d.desired_replicas, d.reasons) for d in decisions]
                raise AssertionError(f"no scale-up applied; decisions {seen[-5:]}") from e
            results = await asyncio.gather(*burst)
            down = await wait_for(lambda: applied(up=False), timeout=120)
    finally:
        await close_nats(nc)
    assert up[0].replicas == 2 and "drained" in down[0].detail
    grew = next(d for d in decisions if d.desired_replicas > d.current_replicas)
    assert any("above threshold" in r for r in grew.reasons), grew.reasons
    assert all(r["usage"]["completion_tokens"] == MAX_TOKENS for r in results)
    assert not [st for st in statuses if st.state == "failed"]


async def _append(into: list[Any], kind: type, msg: Any) -> None:
    into.append(decode(msg.data, kind))
