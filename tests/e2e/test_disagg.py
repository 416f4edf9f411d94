"""Disaggregated serving on real processes: a prefill and a decode mocker worker, frontends that
place every prefill remotely (``always``) or never; the official client; the observations; both
sides' blocks freed; a prefill worker that stalls or dies mid-handoff."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from base.ports import free_port
from infra.command import cli_command
from schemas import RequestObservation, WorkerLoad, decode
from tests.support.clients import openai_client, subscribed
from tests.support.fleet import Fleet
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

MODEL = "jetfleet-tiny"
LONG = "The quick brown fox jumps over the lazy dog. " * 60  # ~2.7k tokens


@pytest.fixture(scope="module")
def disagg(nats_server, redis_server, tmp_path_factory) -> Iterator[tuple[Fleet, str, str]]:
    """KV-aware routing over each pool (the prefill and decode workers' own KV events)."""
    f = Fleet(nats_server.url, tmp_path_factory.mktemp("disagg-logs"), redis_url=redis_server.url)
    try:
        f.add_worker("--role", "prefill")
        f.add_worker("--role", "decode")
        f.start_indexer()
        remote = f.start_frontend("--disagg-policy", "always", "--prefill-timeout", "3")
        local = f.start_frontend(
            "--disagg-policy", "never", name="frontend-local", port=free_port()
        )
        yield f, remote, local
    finally:
        f.stop()


def _chat(url: str, stream: bool = False, **kw: Any) -> str:
    args = {
        "model": MODEL,
        "messages": [{"role": "user", "content": LONG}],
        "max_tokens": 12,
        "seed": 7,
    } | kw
    if stream:
        chunks = openai_client(url).chat.completions.create(**args, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    r = openai_client(url).chat.completions.create(**args)
    assert r.usage.completion_tokens == args["max_tokens"]
    return r.choices[0].message.content or ""


async def _observations(
    fleet: Fleet, count: int, action, keep=lambda _o: True
) -> list[RequestObservation]:
    """The observations (those ``keep`` says are of interest) published while ``action`` runs,
    once ``count`` of them arrived."""
    import nats

    nc = await nats.connect(fleet.nats_url)
    got: list[RequestObservation] = []

    async def on(msg) -> None:
        o = decode(msg.data, RequestObservation)
        if keep(o):
            got.append(o)

    await nc.subscribe(f"{fleet.prefix}.obs.{MODEL}", cb=on)
    await subscribed(nc)
    try:
        await asyncio.to_thread(action)
        await wait_for(lambda: len(got) >= count, timeout=10)
    finally:
        await nc.close()
    return got


async def _latest_load(nc, fleet: Fleet, role: str) -> WorkerLoad | None:
    """A pool's latest load report, from FLEET_METRICS (an idle worker reports once: a
    subscriber that came later would hear nothing)."""
    stream = f"{fleet.prefix.upper()}_METRICS"
    try:
        msg = await nc.jetstream().get_last_msg(stream, f"{fleet.prefix}.metrics.{MODEL}.{role}.*")
    except Exception:  # none yet
        return None
    return decode(msg.data, WorkerLoad)


async def _loads(fleet: Fleet) -> dict[str, WorkerLoad]:
    """Each pool's load once both are idle with no block in use (waited for)."""
    import nats

    nc = await nats.connect(fleet.nats_url)
    loads: dict[str, WorkerLoad] = {}

    async def idle() -> bool:
        for role in ("prefill", "decode"):
            load = await _latest_load(nc, fleet, role)
            if load is not None:
                loads[role] = load
        return len(loads) == 2 and all(
            v.kv_usage == 0 and v.num_running == 0 for v in loads.values()
        )

    try:
        await wait_for(idle, timeout=10)
    finally:
        await nc.close()
    return loads


async def test_remote_and_local_prefill_give_the_same_answer_and_say_so(disagg) -> None:
    fleet, remote, local = disagg
    texts: dict[str, str] = {}

    def run() -> None:
        texts["remote"] = _chat(remote)
        texts["remote-stream"] = _chat(remote, stream=True)
        texts["local"] = _chat(local)

    obs = await _observations(fleet, 3, run)
    # the mocker's tokens are a function of (seed, position): the decode worker continues
    # where the prefill worker's token left off, so the three answers are the same text
    assert texts["remote"] == texts["remote-stream"] == texts["local"] and texts["remote"]
    by = {o.disagg: o for o in obs}
    assert {o.disagg for o in obs} == {"remote", "local"}
    r = by["remote"]
    assert r.disagg_reason == "policy_always" and r.prefill_worker_id and r.kv_transfer_ms > 0
    assert r.worker_id != r.prefill_worker_id and r.attempts == 1 and r.osl_tokens == 12
    # policy never: local, on whichever pool's worker was best
    assert by["local"].disagg_reason in ("policy_never", "policy_never_on_prefill")
    assert by["local"].kv_transfer_ms == 0
    # the prefill worker freed what it held once the decode worker pulled it; nothing leaks
    loads = await _loads(fleet)
    assert set(loads) == {"prefill", "decode"}
    assert "kv_hold_expired" not in fleet.log("worker-0")


async def test_a_stalled_prefill_worker_falls_back_to_a_local_prefill(disagg) -> None:
    fleet, remote, _ = disagg
    pid = fleet.group.children["worker-0"].proc.pid  # the prefill worker
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        obs = await _observations(fleet, 1, lambda: _chat(remote, seed=9))
        # timed out, or (on a loaded machine) ended first by the stalled worker's departure
        assert obs[0].disagg == "local"
        assert obs[0].disagg_reason in ("prefill_timeout", "prefill_failed"), obs[0]
        assert obs[0].status == "ok" and obs[0].osl_tokens == 12
        assert time.monotonic() - started < 15
    finally:
        os.kill(pid, signal.SIGCONT)
    await _loads(fleet)  # and once it runs again, nothing is left held on either side


async def test_short_prompts_prefill_locally_under_the_default_policy(disagg) -> None:
    fleet, _, _ = disagg
    url = fleet.start_frontend(name="frontend-default", port=free_port())  # isl_or_load, 2048

    def run() -> None:
        _chat(url, messages=[{"role": "user", "content": "short"}])
        fresh = "Pack my box with five dozen liquor jugs. " * 70  # nothing cached anywhere
        _chat(url, messages=[{"role": "user", "content": fresh}])

    obs = await _observations(fleet, 2, run)
    # the short one local on whichever pool's worker was best
    short_reason = next(o.disagg_reason for o in obs if o.disagg == "local")
    assert short_reason in ("short_uncached", "short_uncached_on_prefill")
    assert sorted((o.disagg, o.disagg_reason) for o in obs) == [
        ("local", short_reason),
        ("remote", "long_uncached"),
    ]


async def test_a_short_request_runs_whole_on_an_idle_prefill_worker(
    nats_server, redis_server, tmp_path
) -> None:
    """Conditional placement routes over both pools: with the decode worker busy, a short fresh
    prompt runs start to end on the idle prefill worker; a long one still splits (prefilled
    there, decoded on the decode worker); with the option off, the short one stays in the
    decode pool. (Workers in real time: the busy stream lasts seconds.)"""
    fleet = Fleet(
        nats_server.url, tmp_path, redis_url=redis_server.url, worker_args=("--speedup", "1")
    )
    try:
        fleet.add_worker("--role", "prefill")
        fleet.add_worker("--role", "decode")
        fleet.start_indexer()
        remote = fleet.start_frontend("--disagg-policy", "always")
        # isl_or_load; the lowest cost always wins (no softmax sampling between close costs)
        both = fleet.start_frontend("--kv-temperature", "0", name="frontend-both", port=free_port())
        decode_only = fleet.start_frontend(
            "--no-disagg-local-on-prefill-workers", name="frontend-decode-only", port=free_port()
        )
        await _short_on_prefill_long_split(fleet, remote, both, decode_only)
    finally:
        fleet.stop()


async def _short_on_prefill_long_split(
    fleet: Fleet, remote: str, both: str, decode_only: str
) -> None:
    prefill_id, decode_id = (f"{fleet.prefix}-worker-{i}" for i in (0, 1))

    def complete(url: str, prompt: str) -> None:
        r = openai_client(url).completions.create(model=MODEL, prompt=prompt, max_tokens=8, seed=1)
        assert r.usage is not None and r.usage.completion_tokens == 8

    done = threading.Event()

    def keep_decoding() -> None:
        """A generation long enough to outlast the test on a loaded machine (4,000 tokens at
        ~6 ms each), closed once the test has its placements (the frontend then cancels it)."""
        chunks = openai_client(remote).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": LONG}],
            max_tokens=4000,
            seed=21,
            stream=True,
        )
        with chunks:
            for _ in chunks:
                if done.is_set():
                    break

    busy = threading.Thread(target=keep_decoding, daemon=True)
    busy.start()
    try:
        # loaded enough that its cost is clearly the higher one: decoding, and the prefill
        # worker no longer holding the prompt's blocks for it (until the decode worker has
        # pulled them, both report the prompt's blocks: a tie, broken at random)
        await wait_for(lambda: _decoding(fleet, decode_id, min_blocks=12), timeout=15)
        await wait_for(lambda: _holding_nothing(fleet, prefill_id), timeout=15)

        def run() -> None:
            complete(both, f"short and fresh {time.time_ns()}")
            complete(both, f"{time.time_ns()} Five quacking zephyrs jolt my wax bed. " * 70)
            complete(decode_only, f"short and fresh {time.time_ns()}")

        # the busy stream (placed by the "always" frontend) is observed when it ends: wait for
        # the three of this test by what they are, not for any three
        def mine(o: RequestObservation) -> bool:
            return o.isl_tokens < 100 or o.disagg_reason != "policy_always"

        obs = await _observations(fleet, 3, run, keep=mine)
    finally:
        done.set()
        busy.join(60)
    short, kept = sorted((o for o in obs if o.isl_tokens < 100), key=lambda o: o.ts_s)
    (long,) = [o for o in obs if o.isl_tokens > 1000]
    assert (short.disagg, short.disagg_reason, short.worker_id) == (
        "local",
        "short_uncached_on_prefill",
        prefill_id,
    )
    assert (long.disagg, long.prefill_worker_id, long.worker_id) == (
        "remote",
        prefill_id,
        decode_id,
    )
    assert (kept.disagg, kept.worker_id) == ("local", decode_id)


async def _holding_nothing(fleet: Fleet, worker_id: str) -> bool:
    """The prefill worker's last load report shows no sequence and no block in use."""
    import nats

    from schemas import Subjects

    nc = await nats.connect(fleet.nats_url)
    try:
        s = Subjects(fleet.prefix)
        msg = await nc.jetstream().get_last_msg(
            s.stream_name("METRICS"), s.metrics(MODEL, "prefill", worker_id)
        )
        load = decode(msg.data or b"", WorkerLoad)
        return load.num_running == 0 and load.active_decode_blocks == 0
    finally:
        await nc.close()


async def _decoding(fleet: Fleet, worker_id: str, min_blocks: int) -> bool:
    """The worker's last load report shows a running sequence holding ``min_blocks`` or more."""
    import nats

    from schemas import Subjects

    nc = await nats.connect(fleet.nats_url)
    try:
        s = Subjects(fleet.prefix)
        msg = await nc.jetstream().get_last_msg(
            s.stream_name("METRICS"), s.metrics(MODEL, "decode", worker_id)
        )
        load = decode(msg.data or b"", WorkerLoad)
        return load.num_running > 0 and load.active_decode_blocks >= min_blocks
    finally:
        await nc.close()


async def test_nats_clients_get_the_first_token_through_the_router_service(disagg) -> None:
    """A NATS-only client reads one ordinary stream: the decode worker generates every token
    after pulling the prefill's KV (the router service placed the prefill remotely)."""
    import nats

    from schemas import Request, SamplingParams, TokenChunk, encode

    fleet, _, _ = disagg
    fleet.start_router_service("--router", "kv", "--disagg-policy", "always")
    prompt = tuple(LONG.encode())
    nc = await nats.connect(fleet.nats_url)
    chunks: list[TokenChunk] = []
    obs: list[RequestObservation] = []

    async def on_obs(msg) -> None:
        obs.append(decode(msg.data, RequestObservation))

    try:
        await nc.subscribe(f"{fleet.prefix}.obs.{MODEL}", cb=on_obs)
        sub = await nc.subscribe(f"{fleet.prefix}.tok.nats-1")
        req = Request("nats-1", MODEL, prompt, SamplingParams(max_tokens=10, seed=3))
        await nc.jetstream().publish(f"{fleet.prefix}.submit.{MODEL}", encode(req))
        while not chunks or chunks[-1].finish_reason is None:
            # the first chunk waits for the router service's start (a process, on a loaded
            # machine), as in tests/e2e/test_nats_client.py
            msg = await sub.next_msg(timeout=30)
            chunks.append(decode(msg.data, TokenChunk))
        await wait_for(lambda: any(o.request_id == "nats-1" for o in obs), timeout=10)
    finally:
        await nc.close()
    mine = next(o for o in obs if o.request_id == "nats-1")
    assert (mine.disagg, mine.frontend_id) == ("remote", "router-service")
    assert [(c.attempt, c.index) for c in chunks] == [(0, i) for i in range(len(chunks))]
    assert len({c.worker_id for c in chunks}) == 1  # the decode worker
    assert sum(len(c.token_ids) for c in chunks) == 10 and chunks[-1].finish_reason == "length"


async def test_requests_in_flight_complete_when_the_prefill_worker_dies(disagg) -> None:
    """kill -9 of the only prefill worker while 6 remote prefills run: every request ends with
    a whole answer (prefilled on the decode worker instead), and the decode worker ends with no
    block in use. (Last in this module: the fleet has no prefill worker afterwards.)"""
    fleet, remote, _ = disagg
    prompts = [f"{i} Sphinx of black quartz, judge my vow. " * 80 for i in range(6)]

    def one(p: str) -> str:
        return _chat(remote, messages=[{"role": "user", "content": p}], max_tokens=30)

    def started() -> int:
        return fleet.log("worker-0").count('"request_started"')

    async def run() -> list[str]:
        before = started()
        tasks = [asyncio.create_task(asyncio.to_thread(one, p)) for p in prompts]
        await wait_for(lambda: started() > before, timeout=30, interval=0.02)  # one prefilling
        fleet.kill(f"{fleet.prefix}-worker-0")
        return await asyncio.gather(*tasks)

    texts = await run()
    assert all(len(t) > 0 for t in texts)
    after = await _observations(fleet, 1, lambda: _chat(remote, seed=11))
    assert after[0].disagg == "local" and after[0].status == "ok"
    # the dead worker until discovery drops it, then no prefill worker at all
    assert after[0].disagg_reason in ("prefill_failed", "prefill_timeout", "no_prefill_workers")
    import nats

    nc = await nats.connect(fleet.nats_url)

    async def decode_idle() -> bool:
        load = await _latest_load(nc, fleet, "decode")
        return load is not None and load.kv_usage == 0

    try:
        await wait_for(decode_idle, timeout=10)
    finally:
        await nc.close()


async def test_a_decode_worker_that_dies_mid_transfer_leaks_nothing(nats_server, tmp_path) -> None:
    """1 prefill + 2 decode workers, a slow link (a 3k-token prompt takes ~4 s to pull): kill -9
    the decode worker while it pulls; the request migrates to the other decode worker and
    completes, and the prefill worker frees what it held at once (the frontend tells it), not at
    its hold timeout."""
    f = Fleet(nats_server.url, tmp_path / "logs")
    try:
        f.add_worker("--role", "prefill", "--kv-hold-timeout", "600")  # 30 s at speedup 20
        decoders = [
            f.add_worker("--role", "decode", "--kv-transfer-bandwidth", "0.1", "--speedup", "1")
            for _ in range(2)
        ]
        url = f.start_frontend("--router", "round-robin", "--disagg-policy", "always")
        await wait_for(lambda: len(_served_roles(f)) >= 3, timeout=30, interval=0.2)
        obs = await _observations(f, 1, lambda: _chat_and_kill(f, url, decoders))
        assert obs[0].status == "ok" and obs[0].attempts == 2 and obs[0].osl_tokens == 12
        loads = await _loads(f)  # both sides idle with no block in use: nothing held
        assert set(loads) == {"prefill", "decode"}
    finally:
        f.stop()


def _served_roles(f: Fleet) -> list[str]:
    argv = cli_command("status", "--json", "--nats", f.nats_url, "--subject-prefix", f.prefix)
    out = subprocess.run(argv, capture_output=True, text=True)
    return [w["role"] for w in json.loads(out.stdout or "{}").get("workers", [])]


def _chat_and_kill(f: Fleet, url: str, decoders: list[str]) -> None:
    """One request; once a decode worker has started it (its prefill done, its KV arriving for
    ~4 s), kill -9 that worker half a second into the pull. (Waited for, not a fixed second: on
    a loaded machine the request could reach the decode worker after it, and nothing was
    killed.)"""

    def kill_the_busy_one() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for worker_id in decoders:
                name = worker_id.removeprefix(f"{f.prefix}-")
                if '"request_started"' in f.log(name):
                    time.sleep(0.5)
                    f.kill(worker_id)
                    return
            time.sleep(0.05)

    threading.Thread(target=kill_the_busy_one, daemon=True).start()
    _chat(url, messages=[{"role": "user", "content": "Mid-transfer death. " * 150}])
