"""A worker's load reports keep up with its prefills: when a prefill its last report counted
ends, a new report goes out before the first token, so a client that sends its next request on
the last token is routed against the load as it is, not as it was up to a period ago (a stale
report of the previous prompt's prefill made the worker holding the prefix look busy)."""

from __future__ import annotations

import time
import uuid

import nats
import pytest

from schemas import Request, SamplingParams, Subjects, TokenChunk, WorkerLoad, decode, encode
from schemas.requests import routed_msg_id
from tests.e2e.test_fleet_lifecycle import _has
from tests.support.clients import subscribed
from tests.support.fleet import Fleet
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

M = "jetfleet-tiny"


async def _registered(fleet: Fleet, worker: str) -> bool:
    try:
        return await _has(fleet, worker)
    except Exception:  # the worker has not made its bucket yet
        return False


async def test_a_prefill_that_ends_is_reported_before_its_first_token(
    nats_server, tmp_path
) -> None:
    # reports every 20 ms and a tenth of real speed (the prefill lasts about 0.5 s), so some
    # count the prefill; without the report its end triggers, one would have to land in the
    # microseconds before the first token
    args = ("--speedup", "0.1", "--load-interval", "0.02")
    fleet = Fleet(nats_server.url, tmp_path, worker_args=args)
    subjects = Subjects(fleet.prefix)
    nc = await nats.connect(fleet.nats_url)
    seen: list[WorkerLoad | TokenChunk] = []
    try:
        worker = fleet.add_worker()
        await wait_for(lambda: _registered(fleet, worker), timeout=30)

        async def on_load(msg) -> None:
            seen.append(decode(msg.data, WorkerLoad))

        async def on_chunk(msg) -> None:
            seen.append(decode(msg.data, TokenChunk))

        # one connection for both: the worker's publishes arrive in the order it made them
        await nc.subscribe(subjects.metrics(M, "agg", worker), cb=on_load)
        await nc.subscribe(subjects.tok_all(), cb=on_chunk)
        await subscribed(nc)
        rid = f"load-{uuid.uuid4().hex[:8]}"
        prompt = tuple(i % 250 for i in range(1500))  # a prefill of a few simulated ms
        req = Request(rid, M, prompt, SamplingParams(max_tokens=4, ignore_eos=True))
        await nc.jetstream().publish(
            subjects.req_worker(M, worker),
            encode(req),
            headers={"Nats-Msg-Id": routed_msg_id(rid, 0)},
        )

        def final_index() -> int | None:
            return next(
                (
                    i
                    for i, m in enumerate(seen)
                    if isinstance(m, TokenChunk) and m.finish_reason is not None
                ),
                None,
            )

        await wait_for(lambda: final_index() is not None, timeout=30)
        first = next(i for i, m in enumerate(seen) if isinstance(m, TokenChunk))
        loads_before_first = [m for m in seen[:first] if isinstance(m, WorkerLoad)]
        assert any(m.active_prefill_tokens > 0 for m in loads_before_first), seen  # counted
        assert loads_before_first[-1].active_prefill_tokens == 0, seen  # and then not
    finally:
        await nc.close()
        fleet.stop()


async def test_an_idle_worker_says_so_once_and_a_load_goes_out_at_the_next_check(
    nats_server, tmp_path
) -> None:
    """Idle, a worker checks its load every 20 ms but sends its idle report once, and then
    nothing (routers read no fresh report as idle: a fleet of 1,024 idle workers sent every
    frontend 1,024 reports a second); a request's load goes out at the next check, and when it
    is done the worker says once that it is idle again."""
    args = ("--load-interval", "0.02", "--load-keepalive", "1.0")
    fleet = Fleet(nats_server.url, tmp_path, worker_args=args)
    subjects = Subjects(fleet.prefix)
    nc = await nats.connect(fleet.nats_url)
    loads: list[tuple[float, WorkerLoad]] = []
    try:
        worker = fleet.add_worker()
        await wait_for(lambda: _registered(fleet, worker), timeout=30)

        async def on_load(msg) -> None:
            loads.append((time.monotonic(), decode(msg.data, WorkerLoad)))

        await nc.subscribe(subjects.metrics(M, "agg", worker), cb=on_load)
        await subscribed(nc)
        # a subscriber may join after the idle report went out: a drain and a new request
        # would show one; what matters is that nothing more comes while idle
        quiet_from = time.monotonic()
        await wait_for(lambda: time.monotonic() - quiet_from >= 2.5, timeout=10)
        assert len(loads) <= 1, [round(t - quiet_from, 3) for t, _ in loads]  # 125 at one a check
        steps = loads[-1][1].steps_total if loads else 0

        rid = f"busy-{uuid.uuid4().hex[:8]}"
        req = Request(rid, M, tuple(range(40)), SamplingParams(max_tokens=8, ignore_eos=True))
        sent = time.monotonic()
        await nc.jetstream().publish(
            subjects.req_worker(M, worker), encode(req), headers={"Nats-Msg-Id": rid}
        )
        await wait_for(lambda: loads and loads[-1][1].steps_total > steps, timeout=10)
        assert loads[-1][0] - sent < 0.8, "a changed load waited"
        await wait_for(lambda: loads[-1][1].num_running == 0, timeout=10)  # idle again, once
        done = len(loads)
        settled = time.monotonic()
        await wait_for(lambda: time.monotonic() - settled >= 2.0, timeout=10)
        assert len(loads) == done, "an idle worker kept reporting"
    finally:
        await nc.close()
        fleet.stop()
