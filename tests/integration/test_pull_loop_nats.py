"""``base.consume.pull_loop`` against a real NATS server: nats-py's ``fetch(batch=n)`` first
empties the subscription's queue whatever ``n`` is, so messages a timed-out pull request brought
in late come back from the next fetch beyond its batch. The loop hands ``batch`` of them over and
NAKs the rest, which the next fetch gets again: a pool worker never starts more than it has room
for, and nothing is lost."""

from __future__ import annotations

import json
import uuid

from nats.js.api import ConsumerConfig, StreamConfig

from base.connect import close_nats, connect_nats
from base.consume import Fetch, pull_loop
from infra.embedded import EmbeddedNats
from tests.support.wait import wait_for


async def test_a_fetch_of_one_hands_over_one_when_late_messages_wait_in_the_queue(
    nats_server: EmbeddedNats,
) -> None:
    name = f"PULL{uuid.uuid4().hex[:8]}".upper()
    subject = f"pull.{name.lower()}"
    nc = await connect_nats(nats_server.url, "test-pull-loop")
    js = nc.jetstream()
    try:
        await js.add_stream(StreamConfig(name=name, subjects=[subject]))
        await js.add_consumer(name, ConsumerConfig(durable_name="pool", ack_wait=30))
        psub = await js.pull_subscribe_bind("pool", name)
        for i in range(3):
            await js.publish(subject, f"r{i}".encode())
        # what a timed-out fetch leaves behind: a pull request whose messages arrive after the
        # client stopped waiting (here sent by hand to the subscription's inbox)
        await nc.publish(psub._nms, json.dumps({"batch": 3}).encode(), psub._deliver)
        await wait_for(lambda: psub.pending_msgs == 3, timeout=10)

        handled: list[bytes] = []

        async def handle(msg) -> None:  # type: ignore[no-untyped-def]
            handled.append(msg.data)
            await msg.ack()

        asked = [Fetch(1, 1.0)]

        async def one_fetch() -> Fetch | None:
            return asked.pop() if asked else None

        await pull_loop(psub, one_fetch, handle)
        assert handled == [b"r0"]  # one slot, one request
        again = await psub.fetch(batch=2, timeout=5)  # the other two went back to the stream
        assert sorted(m.data for m in again) == [b"r1", b"r2"]
        for m in again:
            await m.ack()
    finally:
        await close_nats(nc)
