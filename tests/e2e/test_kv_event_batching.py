"""A worker's KV events wait up to ``--kv-flush-interval-ms`` to go out together: a request's
prefill blocks and the decode blocks after it arrive in one message rather than one per engine
step (each message costs NATS, the indexer and Redis a round of system calls)."""

from __future__ import annotations

import httpx
import pytest

from base.connect import close_nats, connect_nats
from schemas import KvEventBatch, Subjects, decode
from schemas.kv_events import BlockStored
from tests.support.clients import subscribed
from tests.support.fleet import Fleet
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

M = "jetfleet-tiny"


@pytest.mark.parametrize(("window_ms", "one_message"), [(400, True), (0, False)])
async def test_a_requests_kv_events_go_out_in_one_message_within_the_window(
    nats_server, tmp_path, window_ms: int, one_message: bool
) -> None:
    f = Fleet(
        nats_server.url,
        tmp_path,
        worker_args=("--speedup", "10", "--kv-flush-interval-ms", str(window_ms)),
    )
    nc = await connect_nats(nats_server.url, name="test-kv-batching")
    try:
        worker = f.add_worker()
        url = f.start_frontend("--router", "round-robin")
        batches: list[KvEventBatch] = []

        async def on(msg) -> None:  # type: ignore[no-untyped-def]
            batches.append(decode(msg.data, KvEventBatch))

        await nc.subscribe(Subjects(f.prefix).kv(M, worker), cb=on)
        await subscribed(nc)
        async with httpx.AsyncClient(timeout=30) as client:
            r = await client.post(
                f"{url}/v1/completions",  # 3 blocks of prompt, 1 more decoding
                json={"model": M, "prompt": "k" * 100, "max_tokens": 48, "ignore_eos": True},
            )
            assert r.status_code == 200, r.text

        def stored() -> int:
            return sum(isinstance(e, BlockStored) for b in batches for e in b.events)

        await wait_for(lambda: stored() >= 4, timeout=10)  # 148 tokens: 4 blocks of 32
        with_stored = [b for b in batches if any(isinstance(e, BlockStored) for e in b.events)]
        assert (len(with_stored) == 1) is one_message, [len(b.events) for b in with_stored]
    finally:
        await close_nats(nc)
        f.stop()
