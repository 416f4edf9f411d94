"""Exactly one generation per request attempt, whatever JetStream delivers: the frontend stamps
``Nats-Msg-Id = {id}:{attempt}`` so a republished request is absorbed by the stream's duplicate
window; a copy that gets past it (a redelivery, a republish after the window) of an attempt the
worker already finished is acked without generating again."""

from __future__ import annotations

import uuid

import httpx
import nats
import pytest

from schemas import Request, SamplingParams, Subjects, TokenChunk, decode, encode
from schemas.requests import routed_msg_id
from tests.e2e.test_fleet_lifecycle import _has
from tests.support.clients import subscribed
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

M = "jetfleet-tiny"


async def test_a_request_is_generated_once_however_often_it_is_delivered(fleet) -> None:
    subjects = Subjects(fleet.prefix)
    worker = next(f"{fleet.prefix}-{n}" for n in fleet.group.children if n.startswith("worker"))
    # registered = consuming its subject (a worker subscribes before it registers)
    await wait_for(lambda: _has(fleet, worker), timeout=20)
    subject = subjects.req_worker(M, worker)
    rid, other = (f"dup-{uuid.uuid4().hex[:8]}" for _ in range(2))
    nc = await nats.connect(fleet.nats_url)
    js = nc.jetstream()
    try:
        chunks: list[TokenChunk] = []

        async def on_chunk(msg) -> None:
            chunks.append(decode(msg.data, TokenChunk))

        await nc.subscribe(subjects.tok_all(), cb=on_chunk)
        await subscribed(nc)

        def finals(request_id: str) -> int:
            return sum(c.request_id == request_id and c.finish_reason is not None for c in chunks)

        req = Request(rid, M, tuple(b"hello"), SamplingParams(max_tokens=4))
        headers = {"Nats-Msg-Id": routed_msg_id(rid, 0)}
        first = await js.publish(subject, encode(req), headers=headers)
        again = await js.publish(subject, encode(req), headers=headers)  # a client retry
        assert not first.duplicate and again.duplicate and again.seq == first.seq
        await wait_for(lambda: finals(rid) == 1, timeout=10)

        # Past the duplicate window (another id): the worker knows the attempt finished.
        await js.publish(subject, encode(req), headers={"Nats-Msg-Id": "republished"})
        later = Request(other, M, tuple(b"after"), SamplingParams(max_tokens=2))
        await js.publish(subject, encode(later), headers={"Nats-Msg-Id": routed_msg_id(other, 0)})
        await wait_for(lambda: finals(other) == 1, timeout=10)  # handled in order, after it
        assert finals(rid) == 1
        assert [c.index for c in chunks if c.request_id == rid and c.index == 0] == [0]
    finally:
        await nc.close()


async def test_the_frontend_stamps_each_attempt_with_its_msg_id(fleet) -> None:
    subjects = Subjects(fleet.prefix)
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.post(
            f"{fleet.base_url}/v1/completions",
            json={"model": M, "prompt": "stamp me", "max_tokens": 2},
            headers={"X-Request-Id": f"stamp-{uuid.uuid4().hex[:8]}"},
        )
    assert r.status_code == 200, r.text
    request_id = r.headers["x-request-id"]
    nc = await nats.connect(fleet.nats_url)
    try:
        js = nc.jetstream()
        stream = subjects.stream_name("REQUESTS")
        info = await js.stream_info(stream)
        found = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            try:
                msg = await js.get_msg(stream, seq)
            except nats.js.errors.NotFoundError:
                continue
            if decode(msg.data, Request).request_id.endswith(request_id):
                found.append(msg)
        assert len(found) == 1
        req = decode(found[0].data, Request)
        assert found[0].headers["Nats-Msg-Id"] == routed_msg_id(req.request_id, req.attempt)
    finally:
        await nc.close()
