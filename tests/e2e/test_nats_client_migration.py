"""A NATS-only client across a migration: a chunk of the old attempt arrives after the new
attempt's first (as a worker cut off with chunks in its client delivers them when it comes back),
and the reading rule of the wire contract (``TokenReader``) gives the undisturbed answer anyway.

The migration is real (a worker paused past the router service's stall timeout); the late chunk
is published by the test, because the paused worker itself processes the router's cancel before
it steps again when resumed, and publishes nothing more for the old attempt."""

from __future__ import annotations

import os
import signal
import uuid

import pytest
from nats.aio.client import Client as NATS

from base.connect import connect_nats
from schemas import Request, SamplingParams, Subjects, TokenChunk, decode, encode
from schemas.token_reader import TokenReader
from tests.support.clients import subscribed
from tests.support.fleet import Fleet
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration
M = "jetfleet-tiny"


async def _stream(nc: NATS, s: Subjects, on_chunk=None) -> list[TokenChunk]:
    """Submit a request and return every chunk its subject carried until the reader is done."""
    rid = f"move-{uuid.uuid4().hex[:12]}"
    sub = await nc.subscribe(s.tok(rid))
    await subscribed(nc)
    req = Request(rid, M, tuple(b"a NATS client across a move"), SamplingParams(800, seed=5))
    await nc.jetstream().publish(s.submit(M), encode(req))
    reader, raw = TokenReader(), []
    while reader.final is None:
        chunk = decode((await sub.next_msg(timeout=30)).data, TokenChunk)
        raw.append(chunk)
        reader.take(chunk)
        if on_chunk is not None:
            await on_chunk(chunk)
    await sub.unsubscribe()
    return raw


def _read(chunks: list[TokenChunk]) -> list[int]:
    reader = TokenReader()
    for c in chunks:
        reader.take(c)
    return reader.token_ids


async def test_a_nats_client_reading_by_the_contract_gets_the_undisturbed_answer(
    nats_server, tmp_path
):
    # the worker stays registered while paused (--ttl 60): only the router service's stall
    # timeout moves the request (the resumed worker then takes the router's cancel)
    f = Fleet(nats_server.url, tmp_path, worker_args=("--speedup", "1", "--ttl", "60"))
    paused: list[int] = []
    old_indices: list[int] = []  # the old attempt's chunks the client has seen
    try:
        f.add_worker()
        f.add_worker()
        f.start_router_service("--router", "round-robin", "--stall-timeout", "1")
        await wait_for(lambda: _two_ready(f), timeout=30)
        nc = await connect_nats(f.nats_url, name="test-nats-client")
        s = Subjects(f.prefix)

        async def pause_then_deliver_late(chunk: TokenChunk) -> None:
            if chunk.attempt == 0:
                old_indices.append(chunk.index)
            if chunk.attempt == 0 and chunk.index == 2 and not paused:
                child = f.group.children[chunk.worker_id.removeprefix(f"{f.prefix}-")]
                paused.append(child.proc.pid)
                os.kill(paused[0], signal.SIGSTOP)
            elif chunk.attempt == 1 and chunk.index == 0 and paused and paused[-1] > 0:
                # the old attempt's next chunk (the paused worker may have sent more than the
                # three this callback had seen when it paused it: a loaded machine's client lags)
                nxt = max(old_indices) + 1
                late = TokenChunk(chunk.request_id, 0, nxt, token_ids=(7, 7, 7), text="???")
                await nc.publish(s.tok(chunk.request_id), encode(late))
                os.kill(paused[0], signal.SIGCONT)
                paused.append(-1)

        try:
            moved = await _stream(nc, s, pause_then_deliver_late)
            calm = await _stream(nc, s)
        finally:
            await nc.close()
    finally:
        if paused and paused[-1] > 0:
            os.kill(paused[0], signal.SIGCONT)
        f.stop()
    first_new = next(i for i, c in enumerate(moved) if c.attempt == 1)
    before = sum(len(c.token_ids) for c in moved[:first_new] if c.attempt == 0)
    assert moved[first_new].generated_before == before  # what the router had seen, all of it
    assert any(c.attempt == 0 for c in moved[first_new:])  # the late chunk came
    assert _read(moved) == _read(calm)  # no token repeated, lost or stale
    seen_once: list[int] = []  # the old rule (repeats dropped, nothing else): a garbled answer
    keys: set[tuple[int, int]] = set()
    for c in moved:
        if (c.attempt, c.index) not in keys:
            keys.add((c.attempt, c.index))
            seen_once.extend(c.token_ids)
    assert seen_once != _read(calm)


async def _two_ready(fleet: Fleet) -> bool:
    return len(await fleet.ready_workers()) == 2
