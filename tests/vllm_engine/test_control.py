"""Control ops on a real engine tell the truth: vLLM's CPU build cannot sleep, and says so
while it keeps serving; health reports vLLM's own view (KV blocks, events, unfinished)."""

from __future__ import annotations

import pytest
from openai import AsyncOpenAI

from base.connect import close_nats, connect_nats
from tests.support.up import Up, wait_ready_workers
from tests.vllm_engine.conftest import REAL_FLEET_BLOCKS, START_TIMEOUT_S
from tests.vllm_engine.support import control

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


async def test_sleep_says_the_cpu_build_cannot_and_the_worker_keeps_serving(
    real_fleet: Up,
) -> None:
    worker = wait_ready_workers(real_fleet, 2, START_TIMEOUT_S)[0]["worker_id"]
    nc = await connect_nats(real_fleet.nats_url, name="test")
    try:
        slept = await control(nc, worker, "sleep")
        assert not slept.ok and "CPU build cannot sleep" in slept.detail
        assert (await control(nc, worker, "wake")).ok
        health = await control(nc, worker, "health")
        assert health.ok and health.data["sleeping"] is False
        assert health.data["num_gpu_blocks"] == REAL_FLEET_BLOCKS  # vLLM's own figure
        assert health.data["vllm_unfinished"] == 0
    finally:
        await close_nats(nc)
    async with AsyncOpenAI(base_url=f"{real_fleet.base_url}/v1", api_key="-") as client:
        r = await client.completions.create(
            model="SmolLM2-135M-Instruct", prompt="Hello", max_tokens=3
        )
    assert r.usage is not None and r.usage.completion_tokens == 3
