"""``jetfleet profile``: measure one worker's ``CapacityProfile`` by loading it step by step.

The planner sizes pools from two figures per replica (``planner/capacity.py``). This module
measures both against one running worker over NATS alone: requests go to the worker's own
subject (a router pinned to it), token chunks are timed as they arrive. No frontend, no Redis.

**Prompts.** Random ids from the model's plain-text tokens (``ModelTokenizer
.text_safe_token_ids``), drawn fresh for every request, so no prompt shares a block with
another: the points report the cached tokens the worker saw (expect 0) and only uncached tokens
count. Every request sets ``ignore_eos``.

**Load.** ``c`` slots run a closed loop (a slot sends its next request when its last one ended).
Slots live across a sweep's steps: a step adds slots up to its concurrency, and its window opens
once every new slot has its first token (warm-up) and lasts ``step_duration_s``.

**Prefill sweep.** ``prefill_isl_tokens`` prompts with ``max_tokens=1``. The window lasts until at
least ``prefill_min_requests`` were sent in it; the point waits (the load going on) until those
requests answered. Point: throughput = uncached prompt tokens of the requests whose first token
came in the window / window; latency = p90 TTFT (nearest rank, as the planner's) of the requests
sent in the window.

**Decode sweep.** ``decode_isl_tokens`` prompts, ``max_tokens=decode_osl_tokens``. The first
request of the ``k``-th of ``m`` new slots asks for ``ceil(osl * (k + 1) / m)`` tokens, so
requests end (and new prompts arrive) evenly spread as in steady traffic, not in lock-step
cohorts. Point: throughput = output tokens received in the window / window;
latency = token-weighted mean ITL: over every chunk (after a request's first) received in the
window, the sum of the gaps since the request's previous chunk over the sum of their tokens (a
chunk of ``k`` coalesced tokens ``gap`` s after the last one is ``k`` tokens at ``gap / k``). At
steady state that is the mean per-request ITL the planner checks, without requests cut off by the
window weighing as much as whole ones.

At the end of a sweep the requests still running are cancelled.

**Steps.** Concurrency ``start, start*f, start*f^2, ...`` (rounded, strictly increasing) up to
``max_concurrency`` (default: the worker's ``max_num_seqs``), always ending on it; a sweep stops
after its first step over target.

**Capacity** (``pick_capacity``, pure): the highest throughput of the steps within target; if a
step went over and had more throughput than the last good one, the linear interpolation between
them at the target, ``good.tps + (bad.tps - good.tps) * (target - good.lat) / (bad.lat -
good.lat)``, if higher. No step within target is an error (no capacity at that target).

The worker should be idle: other traffic takes capacity the sweep would credit to it. A request
that fails, stalls ``request_timeout_s``, or a worker that leaves discovery fails the run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import structlog
import uvloop
from nats.aio.client import Client as NATS
from nats.js.errors import NotFoundError

from base.connect import close_nats, connect_nats
from planner.capacity import CapacityProfile, save_profile
from planner.profile_fit import (
    Phase,
    PointCallback,
    ProfileConfig,
    ProfileError,
    ProfileResult,
    RequestTiming,
    SweepPoint,
    decode_point,
    describe,
    geometric_steps,
    over_target,
    pick_capacity,
    prefill_point,
    select_worker,
    stagger,
)
from router.client import ClientConfig, FleetClient
from router.discovery import Discovery, ServedModel
from router.fleet_state import FleetState, WorkerView
from router.generation import Generation, Leg, NoWorkersError, OverloadedError
from router.policies import RouteQuery
from schemas import Request, RouteDecision, SamplingParams, Subjects

log = structlog.get_logger("jetfleet.profile")


class PinnedRouter:
    """A ``Router`` that sends every request to one worker while it is a candidate."""

    name = "pinned"

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id

    async def route(self, query: RouteQuery, candidates: Sequence[WorkerView]) -> RouteDecision:
        if all(v.worker_id != self.worker_id for v in candidates):
            raise NoWorkersError(f"worker {self.worker_id!r} is gone")
        return RouteDecision(policy=self.name, worker_id=self.worker_id)

    async def first_token(self, request_id: str) -> None:
        return None

    async def finished(self, request_id: str) -> None:
        return None


class _Load:
    """Closed-loop slots sending random prompts to the pinned worker through ``client``."""

    def __init__(
        self,
        client: FleetClient,
        leg: Leg,
        model: str,
        vocab: Sequence[int],
        isl: int,
        max_tokens: int,
        rng: random.Random,
    ) -> None:
        self.client, self.leg, self.model, self.vocab = client, leg, model, vocab
        self.isl, self.max_tokens, self.rng = isl, max_tokens, rng
        self.timings: list[RequestTiming] = []
        self.error = ""
        self.failed = asyncio.Event()
        self._changed = asyncio.Event()  # a request was sent or ended, or one failed
        self._slots: list[asyncio.Task[None]] = []
        self._started: list[asyncio.Event] = []
        self._current: dict[int, Generation] = {}
        self._stopping = False

    @property
    def concurrency(self) -> int:
        return len(self._slots)

    def grow_to(self, concurrency: int, first_max_tokens: Sequence[int]) -> list[asyncio.Event]:
        """Add slots up to ``concurrency``; their first requests ask ``first_max_tokens``."""
        events: list[asyncio.Event] = []
        for first in first_max_tokens[: max(concurrency - len(self._slots), 0)]:
            started = asyncio.Event()
            self._started.append(started)
            self._slots.append(asyncio.create_task(self._slot(len(self._slots), first, started)))
            events.append(started)
        return events

    async def wait_started(self, events: Sequence[asyncio.Event], timeout_s: float) -> None:
        try:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), timeout_s)
        except TimeoutError as exc:
            raise ProfileError(f"no first token within {timeout_s} s of warm-up") from exc
        self.check()

    async def run_for(self, seconds: float) -> None:
        """Sleep ``seconds``, waking early if a request fails."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.failed.wait(), seconds)

    async def wait_sent(self, count: int, timeout_s: float) -> None:
        """Until ``count`` requests were sent in all."""
        await self._wait_until(lambda: len(self.timings) >= count, timeout_s, "the window")

    async def wait_answered(self, since: int, before_s: float, timeout_s: float) -> None:
        """Until the requests from index ``since`` sent before ``before_s`` have ended."""
        window = self.timings[since:]
        await self._wait_until(
            lambda: all(r.finished_s for r in window if r.submitted_s < before_s),
            timeout_s,
            "answering the window's requests",
        )

    async def _wait_until(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Until ``done()`` (checked whenever a request is sent or ends) or a failure."""
        deadline = time.monotonic() + timeout_s
        while not done() and not self.error:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), deadline - time.monotonic())
            except TimeoutError:
                self._fail(f"{what} took over {timeout_s} s")
        self.check()

    def check(self) -> None:
        if self.error:
            raise ProfileError(f"a profiling request failed: {self.error}")

    async def stop(self) -> None:
        """Stop sending and cancel the requests in flight."""
        self._stopping = True
        for gen in list(self._current.values()):
            with contextlib.suppress(Exception):
                await gen.cancel("profile_done")
        for task in self._slots:
            task.cancel()
        await asyncio.gather(*self._slots, return_exceptions=True)

    def _fail(self, error: str) -> None:
        self.error = self.error or error
        self.failed.set()
        self._changed.set()
        for started in self._started:
            started.set()

    async def _slot(self, idx: int, first_max_tokens: int, started: asyncio.Event) -> None:
        max_tokens = first_max_tokens
        while not self._stopping:
            timing = await self._send(idx, max_tokens, started)
            if timing.error:
                self._fail(timing.error)
                return
            max_tokens = self.max_tokens

    async def _send(self, idx: int, max_tokens: int, started: asyncio.Event) -> RequestTiming:
        request = Request(
            request_id=f"profile-{uuid.uuid4().hex}",
            model=self.model,
            token_ids=tuple(self.rng.choices(self.vocab, k=self.isl)),
            sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
            created_at_s=time.time(),
        )
        timing = RequestTiming(time.monotonic(), self.isl)
        self.timings.append(timing)
        self._changed.set()
        try:
            gen = await self.client.launch(request, leg=self.leg)
        except (NoWorkersError, OverloadedError) as exc:
            timing.error = str(exc)
            return timing
        self._current[idx] = gen
        try:
            async for chunk in gen:
                now = time.monotonic()
                if chunk.token_ids:
                    if not timing.first_token_s:
                        timing.first_token_s = now
                        started.set()
                    timing.chunks.append((now, len(chunk.token_ids)))
                if chunk.usage is not None:
                    timing.cached_tokens = chunk.usage.cached_tokens
                if chunk.finish_reason == "error":
                    timing.error = chunk.error or "error"
            timing.finished_s = time.monotonic()
            self._changed.set()
        finally:
            self._current.pop(idx, None)
        return timing


async def _sweep(
    phase: Phase,
    client: FleetClient,
    leg: Leg,
    model: str,
    vocab: Sequence[int],
    steps: Sequence[int],
    cfg: ProfileConfig,
    rng: random.Random,
    on_point: PointCallback,
) -> list[SweepPoint]:
    """One sweep (module docstring). Slots live across steps: each step adds some."""
    prefill = phase == "prefill"
    isl = cfg.prefill_isl_tokens if prefill else cfg.decode_isl_tokens
    osl = 1 if prefill else cfg.decode_osl_tokens
    target_s = cfg.ttft_target_s if prefill else cfg.itl_target_s
    points: list[SweepPoint] = []
    load = _Load(client, leg, model, vocab, isl, osl, rng)
    try:
        for c in steps:
            joined = load.grow_to(c, stagger(osl, c - load.concurrency))
            await load.wait_started(joined, cfg.request_timeout_s)
            t0, sent_before = time.monotonic(), len(load.timings)
            await load.run_for(cfg.step_duration_s)
            if prefill:  # enough requests for a percentile, then let the window's ones answer
                await load.wait_sent(sent_before + cfg.prefill_min_requests, cfg.request_timeout_s)
            t1 = time.monotonic()
            if prefill:
                await load.wait_answered(sent_before, t1, cfg.request_timeout_s)
            load.check()
            point = (prefill_point if prefill else decode_point)(load.timings, c, t0, t1)
            points.append(point)
            on_point(phase, point)
            if over_target(point, target_s):
                break
    finally:
        await load.stop()
    return points


async def _find_worker(
    discovery: Discovery,
    joined: asyncio.Event,
    worker_id: str | None,
    model: str | None,
    wait_s: float,
) -> tuple[WorkerView, ServedModel]:
    """The worker to profile and its model, waiting up to ``wait_s`` for them to show up."""
    deadline = time.monotonic() + wait_s
    while True:
        joined.clear()
        try:
            view = select_worker(discovery.state, worker_id, model)
            served = discovery.models.get(view.reg.model)
            if served is not None:
                return view, served
            problem = ProfileError(f"no model card of {view.reg.model!r} in discovery")
        except ProfileError as exc:
            problem = exc
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise problem
        with contextlib.suppress(TimeoutError):  # a join wakes us; a model card has no event
            await asyncio.wait_for(joined.wait(), min(remaining, 0.25))


def _check_lengths(cfg: ProfileConfig, context_length: int) -> None:
    longest = max(cfg.prefill_isl_tokens + 1, cfg.decode_isl_tokens + cfg.decode_osl_tokens)
    if longest > context_length:
        raise ProfileError(
            f"requests of {longest} tokens do not fit the model's context of {context_length}"
        )


async def measure_profile(
    nc: NATS,
    subjects: Subjects,
    worker_id: str | None,
    cfg: ProfileConfig | None = None,
    *,
    model: str | None = None,
    on_point: PointCallback | None = None,
) -> ProfileResult:
    """Run both sweeps against ``worker_id`` (or the first live worker of ``model``) over the
    connected ``nc``; ``on_point(phase, point)`` sees each step as it ends."""
    cfg = cfg or ProfileConfig()
    report: PointCallback = on_point or (lambda _phase, _point: None)
    joined = asyncio.Event()
    discovery = Discovery(nc, subjects, FleetState(), on_worker_joined=lambda _w: joined.set())
    client: FleetClient | None = None
    try:
        try:
            await discovery.start()
        except NotFoundError as exc:
            raise ProfileError(
                f"no fleet with prefix {subjects.prefix!r} on this NATS server ({exc})"
            ) from exc
        view, served = await _find_worker(
            discovery, joined, worker_id, model, cfg.wait_for_worker_s
        )
        reg = view.reg
        _check_lengths(cfg, served.card.context_length)
        if view.queued_estimate():
            log.warning("worker_busy", worker_id=reg.worker_id, requests=view.queued_estimate())
        client = FleetClient(
            nc,
            subjects,
            discovery.state,
            PinnedRouter(reg.worker_id),
            ClientConfig(
                stall_timeout_s=cfg.request_timeout_s,
                max_attempts=1,  # a lost worker fails the run: no migration to another one
                max_waiting_per_worker=1 << 30,  # the sweep bounds its own concurrency
            ),
        )
        # the pinned worker's own role, whatever the model's other workers: no placement
        leg = Leg(reg.role, (reg.role,), 1, cfg.request_timeout_s)
        client.start()
        vocab = served.tokenizer.text_safe_token_ids()
        top = cfg.max_concurrency or reg.max_num_seqs
        steps = geometric_steps(min(cfg.start_concurrency, top), cfg.step_factor, top)
        rng = random.Random(cfg.seed)
        args = (client, leg, reg.model, vocab, steps, cfg, rng, report)
        prefill_points = await _sweep("prefill", *args)
        prefill = pick_capacity(prefill_points, cfg.ttft_target_s, "prefill", cfg.interpolate)
        decode_points = await _sweep("decode", *args)
        decode = pick_capacity(decode_points, cfg.itl_target_s, "decode", cfg.interpolate)
    finally:
        if client is not None:
            await client.stop()
        await discovery.stop()
    profile = CapacityProfile(
        prefill_tokens_per_s=round(prefill.tokens_per_s, 1),
        decode_tokens_per_s=round(decode.tokens_per_s, 1),
        description=describe(reg, cfg, datetime.now(UTC)),
    )
    return ProfileResult(
        profile, reg, cfg, prefill, decode, tuple(prefill_points), tuple(decode_points)
    )


# ----------------------------------------------------------------------------- command line


def add_profile_args(p: argparse.ArgumentParser) -> None:
    """The flags of ``jetfleet profile`` (``--nats``, ``--subject-prefix`` come from the CLI)."""
    d = ProfileConfig()
    p.add_argument("--worker-id", default=None, help="worker to measure (default: see --model)")
    p.add_argument("--model", default=None, help="else the first live worker of this model")
    p.add_argument("--out", default="profile.json", help="profile JSON to write (%(default)s)")
    p.add_argument(
        "--ttft-target", type=float, default=d.ttft_target_s, help="p90 TTFT, s (%(default)s)"
    )
    p.add_argument(
        "--itl-target", type=float, default=d.itl_target_s, help="mean ITL, s (%(default)s)"
    )
    p.add_argument(
        "--isl", type=int, default=d.prefill_isl_tokens, help="prefill prompt tokens (%(default)s)"
    )
    p.add_argument(
        "--decode-isl",
        type=int,
        default=d.decode_isl_tokens,
        help="decode prompt tokens (%(default)s)",
    )
    p.add_argument(
        "--osl", type=int, default=d.decode_osl_tokens, help="decode output tokens (%(default)s)"
    )
    p.add_argument(
        "--max-concurrency", type=int, default=0, help="last step (0: the worker's max_num_seqs)"
    )
    p.add_argument(
        "--step-factor", type=float, default=d.step_factor, help="between steps (%(default)s)"
    )
    p.add_argument(
        "--duration", type=float, default=d.step_duration_s, help="s per step (%(default)s)"
    )
    p.add_argument(
        "--min-requests",
        type=int,
        default=d.prefill_min_requests,
        help="prefill requests per step at least (%(default)s)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=d.request_timeout_s,
        help="s a request may stall or a warm-up take (%(default)s)",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=d.wait_for_worker_s,
        help="s to wait for the worker to register (%(default)s)",
    )
    p.add_argument("--seed", type=int, default=None, help="prompt seed (default: fresh prompts)")
    p.add_argument(
        "--no-interpolate", action="store_true", help="capacity = best step within target"
    )


def config_from_args(args: argparse.Namespace) -> ProfileConfig:
    return ProfileConfig(
        ttft_target_s=args.ttft_target,
        itl_target_s=args.itl_target,
        prefill_isl_tokens=args.isl,
        decode_isl_tokens=args.decode_isl,
        decode_osl_tokens=args.osl,
        step_factor=args.step_factor,
        max_concurrency=args.max_concurrency,
        step_duration_s=args.duration,
        prefill_min_requests=args.min_requests,
        request_timeout_s=args.timeout,
        wait_for_worker_s=args.wait,
        interpolate=not args.no_interpolate,
        seed=args.seed,
    )


def _print_point(phase: str, p: SweepPoint) -> None:
    metric = "p90 TTFT" if phase == "prefill" else "mean ITL"
    print(
        f"{phase} concurrency {p.concurrency}: {p.tokens_per_s:.1f} tokens/s, "
        f"{metric} {p.latency_s * 1000:.2f} ms ({p.requests} requests)",
        file=sys.stderr,
        flush=True,
    )


async def _profile(
    args: argparse.Namespace, subjects: Subjects, cfg: ProfileConfig
) -> ProfileResult:
    try:
        nc = await connect_nats(args.nats, name="jetfleet-profile", max_reconnect_attempts=2)
    except Exception as exc:  # nats-py raises several kinds; all mean "no server there"
        raise ProfileError(f"cannot connect to NATS at {args.nats}: {exc!r}") from exc
    try:
        return await measure_profile(
            nc, subjects, args.worker_id, cfg, model=args.model, on_point=_print_point
        )
    finally:
        await close_nats(nc)


def run_profile(args: argparse.Namespace, subjects: Subjects) -> int:
    """``jetfleet profile``: measure a running worker, print the sweep as JSON, write the profile.

    Command line (``--nats`` and ``--subject-prefix`` as for every command)::

        jetfleet profile [--worker-id W | --model M] [--out profile.json]
            [--ttft-target 0.5] [--itl-target 0.05] [--isl 2048] [--decode-isl 256]
            [--osl 256] [--max-concurrency N] [--step-factor 2] [--duration 5]
            [--min-requests 20] [--timeout 60] [--wait 5] [--seed N] [--no-interpolate]

    Then ``jetfleet planner --profile profile.json`` sizes pools from it. Each step is printed
    to stderr as it ends; stdout carries one JSON object (profile, worker, settings, every
    point). Exit 0 with the profile written, 1 if it cannot be measured, 2 for bad settings.
    """
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        print(f"jetfleet profile: {exc}", file=sys.stderr)
        return 2
    try:
        result = uvloop.run(_profile(args, subjects, cfg))
    except ProfileError as exc:
        print(f"jetfleet profile: {exc}", file=sys.stderr)
        return 1
    save_profile(result.profile, args.out)
    print(json.dumps(result.to_dict(), indent=2))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
