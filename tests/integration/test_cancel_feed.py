"""The cancel feed of a worker process: one ``fleet.cancel.*`` subscription however many workers
join (concurrently), each cancel to the worker holding its request, none left when all leave."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from base.connect import close_nats, connect_nats
from infra.embedded import EmbeddedNats
from schemas import CancelRequested, Subjects, encode
from tests.support.clients import subscribed
from tests.support.wait import wait_for
from workers.cancels import CancelFeed

pytestmark = pytest.mark.integration


def _cancel_subscriptions(server: EmbeddedNats, subjects: Subjects) -> int:
    """Subscriptions on the cancel subject, as the server counts them (its monitoring port)."""
    with urllib.request.urlopen(f"{server.monitor_url}/connz?subs=1", timeout=5) as r:
        conns = json.loads(r.read())["connections"]
    return sum(c.get("subscriptions_list", []).count(subjects.cancel_all()) for c in conns)


async def test_one_subscription_and_each_cancel_to_its_holder(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path, port=0, monitor_port=0)
    server.start()
    subjects = Subjects("t")
    nc = await connect_nats(server.url, name="worker-process")
    try:
        feed = CancelFeed(nc, subjects)
        got: dict[int, list[str]] = {i: [] for i in range(8)}

        def handler(i: int) -> Callable[[CancelRequested], Awaitable[None]]:
            async def on_cancel(cancel: CancelRequested) -> None:
                got[i].append(cancel.request_id)

            return on_cancel

        joined = await asyncio.gather(
            *(feed.subscribe({f"r{i}": object()}, handler(i)) for i in range(8))
        )
        await subscribed(nc)
        assert _cancel_subscriptions(server, subjects) == 1
        for rid in ("r3", "nobody", "r5"):
            await nc.publish(subjects.cancel(rid), encode(CancelRequested(rid)))
        # one subscription delivers in order: once r5 is handled, r3 and "nobody" were
        await wait_for(lambda: got[5] == ["r5"], timeout=10)
        assert got == {i: ([f"r{i}"] if i in (3, 5) else []) for i in range(8)}
        await asyncio.gather(*(m.unsubscribe() for m in joined))
        await subscribed(nc)
        assert _cancel_subscriptions(server, subjects) == 0
    finally:
        await close_nats(nc)
        server.stop()
