"""Decodable but invalid requests, published where workers and the router service read them:
each is terminated and dead-lettered with its reason, its client (when its id can name a
subject) gets an error chunk at once, and the consumers go on serving."""

from __future__ import annotations

import uuid

import httpx
import nats
import pytest

from schemas import DeadLetter, Request, Subjects, TokenChunk, decode, encode
from schemas.streams import WORKERS_BUCKET
from tests.support.builders import poison_requests
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

M = "jetfleet-tiny"


@pytest.mark.parametrize("where", ["pool", "worker", "submit"])
async def test_poison_is_refused_once_and_the_fleet_serves_on(fleet, where: str) -> None:
    if where == "submit" and "router" not in fleet.group.children:
        fleet.start_router_service("--router", "round-robin")
    subjects = Subjects(fleet.prefix)
    rid = f"poison-{uuid.uuid4().hex[:8]}"
    nc = await nats.connect(fleet.nats_url)
    try:
        component = "router" if where == "submit" else "worker"
        letters: list[DeadLetter] = []
        chunks: list[TokenChunk] = []

        async def on_letter(msg) -> None:
            letters.append(decode(msg.data, DeadLetter))

        async def on_chunk(msg) -> None:
            chunks.append(decode(msg.data, TokenChunk))

        await nc.subscribe(subjects.dlq(component), cb=on_letter)
        await nc.subscribe(subjects.tok_all(), cb=on_chunk)
        workers = [f"{fleet.prefix}-{n}" for n in fleet.group.children if n.startswith("worker")]
        subject = {
            "pool": subjects.req_pool(M, "agg"),
            "worker": subjects.req_worker(M, workers[0]),
            "submit": subjects.submit(M),
        }[where]
        # a worker's own consumer delivers only what is published after it exists; it exists once
        # the worker is registered (the frontend is ready with one worker of two registered)
        registered = await nc.jetstream().key_value(subjects.bucket_name(WORKERS_BUCKET))

        async def all_registered() -> bool:
            keys = await registered.keys()
            return set(workers) <= set(keys)

        await wait_for(all_registered, timeout=30)
        poison = poison_requests(rid, M)
        for _, req in poison:
            await nc.jetstream().publish(subject, encode(req))
        # submit: the router service may just have started (a process, on a loaded machine)
        await wait_for(lambda: len(letters) >= len(poison), timeout=30)
        for (problem, _), letter in zip(poison, sorted(letters, key=_order(poison)), strict=True):
            assert problem in letter.reason
        ended = {c.request_id for c in chunks if c.finish_reason == "error"}
        await wait_for(lambda: {rid, rid + "-e", rid + "-v"} <= ended, timeout=10)
    finally:
        await nc.close()
    async with httpx.AsyncClient(timeout=30) as client:  # and the fleet still serves
        for _ in range(4):
            r = await client.post(
                f"{fleet.base_url}/v1/completions",
                json={"model": M, "prompt": "x", "max_tokens": 3},
            )
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert len(letters) == len(poison)  # each refused once: terminated, not redelivered


def _order(poison: list[tuple[str, Request]]):
    names = [p for p, _ in poison]

    def key(letter: DeadLetter) -> int:
        return next(i for i, n in enumerate(names) if n in letter.reason)

    return key
