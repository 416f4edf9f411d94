"""vLLM's own KV events, through the worker and the indexer, into the Redis prefix index: what
the index says a worker holds is what vLLM then serves from its prefix cache, as blocks are
stored, evicted from a small cache and reset. One tiny-Llama worker with 40 blocks of 32 tokens,
prompts as token ids (the byte tokenizer: ids 0-255)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from base.connect import close_nats, connect_nats, connect_redis
from router.kv.keys import namespace
from router.kv.redis_index import RedisPrefixIndex
from router.kv.translate import fleet_hashes_for_prompt
from tests.support.up import Up, running_up
from tests.support.wait import wait_for
from tests.vllm_engine.conftest import START_TIMEOUT_S
from tests.vllm_engine.support import control

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

M = "jetfleet-tiny-llama"
BLOCK = 32
NUM_BLOCKS = 40


@pytest.fixture(scope="module")
def small_cache_fleet(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with running_up(
        tmp_path_factory.mktemp("small-cache"), 1, "--engine", "vllm", "--model", str(tiny_llama),
        "--vllm-arg", f"num_gpu_blocks_override={NUM_BLOCKS}", "--max-model-len", "1024",
        start_timeout_s=START_TIMEOUT_S,
    ) as fleet:  # fmt: skip
        yield fleet


class Probe:
    """The fleet's index and the worker's own view, side by side."""

    def __init__(self, fleet: Up, nc: Any, index: RedisPrefixIndex, http: httpx.AsyncClient):
        self.fleet, self.nc, self.index, self.http = fleet, nc, index, http
        self.worker: str = fleet.workers()[0]["worker_id"]

    async def complete(self, tokens: list[int]) -> int:
        """Send the prompt (token ids); vLLM's cached-token count for it."""
        r = await self.http.post(
            f"{self.fleet.base_url}/v1/completions",
            json={"model": M, "prompt": tokens, "max_tokens": 1, "temperature": 0},
        )
        assert r.status_code == 200, r.text
        return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

    async def settled(self) -> int:
        """Until the index holds as many blocks of the worker as vLLM's events say it has."""

        async def same() -> int | None:
            health = await control(self.nc, self.worker, "health")
            held = await self.index.held_blocks(M, self.worker)
            return held + 1 if held == health.data["cached_blocks"] else None

        return int(await wait_for(same, timeout=15)) - 1

    async def settled_at_least(self, n: int) -> int:
        """``settled`` once the worker has reported at least ``n`` blocks (its events may still
        be on their way when both sides say 0)."""

        async def enough() -> int | None:
            held = await self.settled()
            return held + 1 if held >= n else None

        return int(await wait_for(enough, timeout=30)) - 1

    async def indexed_blocks(self, tokens: list[int]) -> int:
        hashes = fleet_hashes_for_prompt(tokens, BLOCK)  # the worker's default branch blocks
        return (await self.index.match(M, hashes)).get(self.worker, 0)


@pytest.fixture
async def probe(small_cache_fleet: Up) -> AsyncIterator[Probe]:
    nc = await connect_nats(small_cache_fleet.nats_url, name="test")
    redis = await connect_redis(small_cache_fleet.redis_url)
    async with httpx.AsyncClient(timeout=120) as http:
        p = Probe(small_cache_fleet, nc, RedisPrefixIndex(redis, namespace("fleet")), http)
        assert (await control(nc, p.worker, "clear_kv")).ok
        await p.settled()
        yield p
    await redis.aclose()
    await close_nats(nc)


def prompt(seed: int, blocks: int) -> list[int]:
    """``blocks`` full blocks and a partial one (vLLM always computes a prompt's last token)."""
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(blocks * BLOCK + 7)]


async def test_stored_blocks_are_what_vllm_serves(probe: Probe) -> None:
    a = prompt(1, 5)
    assert await probe.complete(a) == 0
    assert await probe.settled_at_least(5) >= 5
    assert await probe.indexed_blocks(a) == 5
    assert await probe.complete(a) == 5 * BLOCK  # vLLM's own count agrees with the index


async def test_evicted_blocks_leave_the_index(probe: Probe) -> None:
    first = prompt(2, 6)
    await probe.complete(first)
    for seed in range(3, 9):  # 6 x 9 blocks through a 40-block cache: the first is evicted
        await probe.complete(prompt(seed, 9))
    held = await probe.settled()
    assert held <= NUM_BLOCKS
    predicted = await probe.indexed_blocks(first)
    assert predicted < 6  # gone (the index saw vLLM's BlockRemoved)
    assert await probe.complete(first) == predicted * BLOCK  # and vLLM agrees


async def test_a_reset_clears_the_workers_blocks(probe: Probe) -> None:
    a = prompt(10, 4)
    await probe.complete(a)
    assert await probe.settled_at_least(4) >= 4
    reply = await control(probe.nc, probe.worker, "clear_kv")
    assert reply.ok and reply.data["confirmed"] is True
    assert await probe.settled() == 0
    assert await probe.indexed_blocks(a) == 0
    assert await probe.complete(a) == 0  # vLLM recomputes it: its cache really was reset


async def test_the_fleet_refuses_what_vllm_cannot_hold(probe: Probe) -> None:
    """The worker publishes vLLM's context (--max-model-len 1024), not the card's 8192: an
    over-long prompt is the frontend's clear 400, not an error from inside vLLM."""
    r = await probe.http.post(
        f"{probe.fleet.base_url}/v1/completions",
        json={"model": M, "prompt": prompt(11, 40), "max_tokens": 1},
    )
    assert r.status_code == 400, r.text
    assert "1024" in r.json()["error"]["message"]
