"""KV-aware routing on real engines, judged by vLLM's own cached-token counts: shared system
prompts are served from vLLM's prefix cache on repeat, and the KV router finds more of them than
round-robin does over the same two SmolLM2 workers."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from openai import AsyncOpenAI

from base.connect import close_nats, connect_nats
from base.ports import free_port
from base.process import ProcessGroup, wait_http_ok
from infra.command import cli_command
from tests.support.up import Up, wait_ready_workers
from tests.vllm_engine.conftest import START_TIMEOUT_S
from tests.vllm_engine.support import control

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

M = "SmolLM2-135M-Instruct"
SYSTEMS = [  # three assistants, each with a long system prompt (over 5 blocks of 32 tokens)
    f"You are {name}, an assistant of the {team} team. " + rule * 16
    for name, team, rule in (
        ("Ada", "billing", "Answer questions about invoices, refunds and payment methods. "),
        ("Bo", "shipping", "Answer questions about parcels, carriers and delivery dates. "),
        ("Cy", "support", "Answer questions about accounts, passwords and settings. "),
    )
]


async def _cached(client: AsyncOpenAI, system: str, question: str) -> int:
    r = await client.chat.completions.create(
        model=M,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        temperature=0,
        max_tokens=2,
    )
    details = r.usage.prompt_tokens_details if r.usage else None
    return int(details.cached_tokens or 0) if details else 0


async def _clear(fleet: Up) -> None:
    nc = await connect_nats(fleet.nats_url, name="test")
    try:
        for w in wait_ready_workers(fleet, 2, START_TIMEOUT_S):
            assert (await control(nc, w["worker_id"], "clear_kv")).ok
    finally:
        await close_nats(nc)


async def _interleaved(client: AsyncOpenAI) -> list[int]:
    """Each system prompt four times, interleaved (A B C A B C ...), a new question each time."""
    return [
        await _cached(client, system, f"Question number {round_} for {i}?")
        for round_ in range(4)
        for i, system in enumerate(SYSTEMS)
    ]


@pytest.fixture
async def round_robin(
    real_fleet: Up, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    """A second frontend on the same fleet, routing round-robin."""
    group = ProcessGroup(tmp_path_factory.mktemp("rr-frontend"))
    port = free_port()
    group.start(
        "frontend-rr",
        cli_command(
            "frontend", "--nats", real_fleet.nats_url, "--redis", real_fleet.redis_url,
            "--router", "round-robin", "--port", str(port),
        ),
    )  # fmt: skip
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/ready", 60, group)
        yield f"http://127.0.0.1:{port}"
    finally:
        group.stop_all()


async def test_shared_system_prompts_are_served_from_vllms_prefix_cache(real_fleet: Up) -> None:
    await _clear(real_fleet)
    async with AsyncOpenAI(base_url=f"{real_fleet.base_url}/v1", api_key="-") as client:
        cached = await _interleaved(client)
    assert cached[:3] == [0, 0, 0]  # first sight of each system prompt
    assert all(c >= 5 * 32 for c in cached[3:]), cached  # every repeat: its blocks, from vLLM


async def test_kv_routing_finds_more_cached_tokens_than_round_robin(
    real_fleet: Up, round_robin: str
) -> None:
    totals = {}
    for name, url in (("kv", real_fleet.base_url), ("round-robin", round_robin)):
        await _clear(real_fleet)
        async with AsyncOpenAI(base_url=f"{url}/v1", api_key="-") as client:
            totals[name] = sum(await _interleaved(client))
    assert totals["kv"] > totals["round-robin"], totals
