"""Chaos: Redis loses the index under `jetfleet up` (FLUSHALL). 40 s later the same prefixes
are found in the workers' caches again as often as before it (the indexer notices the missing
epoch, wipes what it wrote since, and rebuilds from its snapshot and FLEET_KV). Slow (a 40 s
wait is the point); the default suite covers the healing in tests/integration/test_indexer.py.
Prints its figures."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import redis

from base.ports import free_port
from base.process import wait_http_ok
from infra.command import cli_command

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HEADS = [f"Head {i}: " + f"shared context number {i} " * 60 for i in range(8)]


async def _share(http: httpx.AsyncClient, url: str, tag: str) -> float:
    """Cached share of the prompt tokens over one request per head (new suffix each)."""
    cached = total = 0

    async def one(head: str) -> tuple[int, int]:
        body = {
            "model": "jetfleet-tiny",
            "messages": [{"role": "user", "content": f"{head} question {tag}"}],
            "max_tokens": 4,
        }
        r = await http.post(f"{url}/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        return usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]

    for c, t in await asyncio.gather(*(one(h) for h in HEADS)):
        cached, total = cached + c, total + t
    return cached / total


async def test_the_index_heals_after_flushall_under_up(tmp_path: Path) -> None:
    port, redis_port = free_port(), free_port()
    argv = cli_command(
        "up", "--port", str(port), "--nats-port", str(free_port()), "--redis-port",
        str(redis_port), "--state-dir", str(tmp_path / "state"), "--workers", "2",
        "--no-planner",
    )  # fmt: skip
    log = tmp_path / "up.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)  # noqa: ASYNC220
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while not re.search("jetfleet is up", log.read_text(errors="replace")):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            await asyncio.sleep(0.2)
        await asyncio.to_thread(wait_http_ok, f"{url}/ready", 30)
        async with httpx.AsyncClient(timeout=60) as http:
            for i in range(3):
                await _share(http, url, f"warm-{i}")
            warm = await _share(http, url, "warm")
            with redis.Redis(port=redis_port) as r:
                r.flushall()
            flushed_at = time.monotonic()
            # traffic goes on: its KV events reach the emptied Redis at once (with a stream
            # position), the case where resuming from "the position in Redis" would keep a
            # partial index for good
            stop = asyncio.Event()

            async def traffic(i: int) -> None:
                n = 0
                while not stop.is_set():
                    n += 1
                    # small prompts, paced: they make KV events without evicting the heads
                    body = {"model": "jetfleet-tiny", "prompt": f"other {i}-{n} " * 4,
                            "max_tokens": 2}  # fmt: skip
                    await http.post(f"{url}/v1/completions", json=body)
                    await asyncio.sleep(0.5)

            loops = [asyncio.create_task(traffic(i)) for i in range(2)]
            await asyncio.sleep(40)  # the bar: 40 s after the loss
            stop.set()
            await asyncio.gather(*loops)
            after = await _share(http, url, "after")
            healed_in = time.monotonic() - flushed_at
        print(
            f"\nFLUSHALL under up: warm cached share {warm:.1%}, {healed_in:.0f}s after the "
            f"flush {after:.1%} ({after / warm:.0%} of warm)"
        )
        assert warm > 0.5
        assert after >= 0.9 * warm
    finally:
        proc.send_signal(2)
        proc.wait(120)
