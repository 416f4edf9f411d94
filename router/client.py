"""The routing library: route a tokenized request, publish it, follow its token stream.

Used by the HTTP frontend (in-process, no extra hop), the router service and ``jetfleet publish``.
One client serves every kind of model: aggregated workers as ever, and for a model with
``decode`` workers a per-request placement of the prefill (``router/disagg.py``, below).

Life of a request (``Generation``, ``router/generation.py``):
1. subscribe to fleet.tok.{request_id} (core NATS: it sees each chunk ahead of any consumer); the
   subscription feeds the request's ``TokenStream`` (``router/token_stream.py``);
2. choose a worker (policy) and publish the ``Request`` with ``Nats-Msg-Id = {id}:{attempt}``;
3. the generation yields chunks in ``(attempt, index)`` order, the stream dropping stale and
   duplicate ones and filling gaps from the ``FLEET_TOKENS`` stream;
4. if the worker leaves the fleet or goes silent past ``stall_timeout_s``, the stream is
   interrupted and the generation migrates: re-routed to another worker with the tokens
   generated so far appended to the prompt (attempt + 1), so the caller sees one uninterrupted
   stream; after ``max_attempts`` it ends with an error chunk. A silent worker with no other
   worker to move to is waited on up to ``max_attempts`` more stall timeouts first
   (``TokenStream.check_stall``): a migration with nowhere to go could only fail the request.

The client is the generations' ``Dispatch``: it routes, publishes (retrying while the stream
elects a leader), cancels, keeps the in-flight count (``FleetState.count``) and releases
reservations. It learns that a worker left one way, from the fleet state (discovery removing the
worker), and then only feeds the streams of the requests on it; a stall watchdog feeds them the
time, and a NATS reconnect starts a catch-up of each. One in-flight table and one watchdog for
all the requests, each generation routed along its ``Leg``.

**Disaggregated models.** Remote placement, for a request ``r``:

1. the decode worker is chosen first (KV-aware over the decode workers, reserved), so the
   placement (``disagg.plan``) sees what that worker has cached;
2. ``r-prefill`` goes to the prefill pool (KV-aware over the prefill workers' own events) with
   ``max_tokens=1``, ``min_tokens=1`` and ``kv_transfer_params={"do_remote_decode": true}``
   (``router/prefill_leg.py``): the prefill leg of ``r``'s generation;
3. ``r`` goes to the chosen decode worker once the prefill answered, unchanged but for the
   ``kv_transfer_params`` it returned: the decode worker pulls the prompt's KV, computes the last
   prompt token and generates every token, the first included. The prefill's own token is not
   used, as in vLLM's disaggregation proxy and NVIDIA Dynamo: the whole answer comes from one
   sampler, and NATS clients read one ordinary stream on ``fleet.tok.r``.

A request that will be prefilled locally wherever it lands (a whole prompt under the threshold,
the policy ``never``, or no prefill at all: an embedding) is routed over both pools (with a
router only) and, when a prefill worker is the best, runs there whole (``disagg_reason``
``..._on_prefill``). A prefill worker's queue, for the saturation rule, is the remote prefills
in flight there or the requests it reports waiting, not the whole requests it decodes. A prefill
that fails, stalls past ``prefill_timeout_s`` or cannot be placed falls back to a local prefill
on the same decode worker: the caller sees a normal answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import NoStreamResponseError, ServiceUnavailableError

from base.cancelling import cancel_and_wait
from router.disagg import (
    DisaggConfig,
    Placement,
    plan,
    routes_over_both_pools,
    stays_on_prefill_worker,
)
from router.fleet_state import FleetState
from router.generation import (
    Generation,
    Leg,
    NoWorkersError,
    OverloadedError,
    Routed,
    with_route,
)
from router.hold_queue import HoldKey
from router.holding import Holding
from router.policies import RouteQuery, Router
from router.prefill_leg import PrefillLeg, prefill_request
from router.token_stream import StoredChunks, TokenStream
from schemas import CancelRequested, Request, RouteDecision, encode
from schemas.control import kv_release
from schemas.requests import prefill_request_id, routed_msg_id
from schemas.subjects import Subjects
from schemas.trace import HEADER as TRACE_HEADER

log = structlog.get_logger("jetfleet.router")


@dataclass(frozen=True)
class ClientConfig:
    # no chunk for this long from a live worker whose engine took no step either: migrate (with
    # no other worker to go to, wait up to max_attempts such timeouts in a row first)
    stall_timeout_s: float = 60.0
    max_attempts: int = 3  # first try + migrations
    max_waiting_per_worker: int = 64  # shed when every worker holds capacity + this
    hold_waiting_per_worker: int = 8
    """Once every worker has this many requests waiting for a slot, new ones wait in the
    frontend until a worker has room, so a worker that joins takes them (0: never)."""
    wait_for_worker_s: float = 5.0  # with no live worker for the model, wait this long, then 503
    publish_retry_s: float = 10.0
    """A request the stream does not confirm (its leader moved: a NATS node lost, an election)
    is published again, with backoff, for up to this long before the client hears 503 (the
    message id makes a retry of a stored one a no-op)."""


@dataclass(slots=True)
class _InFlight:
    gen: Generation
    sub: Subscription


class FleetClient:
    def __init__(
        self,
        nc: NATS,
        subjects: Subjects,
        state: FleetState,
        router: Router | None,
        cfg: ClientConfig | None = None,
        disagg: DisaggConfig | None = None,
        on_route: Callable[[RouteDecision], None] = lambda _d: None,
        on_placement: Callable[[str, Placement], None] = lambda _model, _p: None,
    ) -> None:
        """``on_placement(model, placement)`` hears where each disaggregated request's prefill
        was placed."""
        self.nc = nc
        self.js = nc.jetstream()
        self.subjects = subjects
        self.state = state
        self.router = router
        self.cfg = c = cfg or ClientConfig()
        self.disagg = disagg or DisaggConfig()
        self.agg = Leg("agg", ("agg",), c.max_attempts, c.stall_timeout_s)
        self.decode = Leg("decode", ("decode",), c.max_attempts, c.stall_timeout_s)
        # over both pools (a local prefill that may run on a prefill worker), with a router only:
        # without one, a pool is one subject per role
        self.either = Leg("decode", ("decode", "prefill"), c.max_attempts, c.stall_timeout_s)
        # a prefill is not migrated: a stalled or lost one is prefilled on the decode worker
        self.prefill = Leg("prefill", ("prefill",), 1, self.disagg.prefill_timeout_s, True)
        self._on_route = on_route
        self._on_placement = on_placement
        self._store = StoredChunks(self.js, subjects)
        self.active: dict[str, _InFlight] = {}
        self._background: set[asyncio.Task[None]] = set()  # first-token releases, catch-ups
        self._watchdog: asyncio.Task[None] | None = None
        # a pool's workers pull only what they have room for: nothing is held
        per_worker = c.hold_waiting_per_worker if router is not None else 0
        self.holding = Holding(state, per_worker, nc, subjects)
        state.on_departure(self.worker_gone)

    def start(self) -> None:
        self._watchdog = asyncio.create_task(self._watch(), name="stall-watchdog")

    async def stop(self) -> None:
        await cancel_and_wait([t for t in (self._watchdog,) if t is not None])
        await self.holding.stop()

    # ------------------------------------------------------------------ routing
    async def route(self, request: Request, exclude: Sequence[str], leg: Leg) -> Routed:
        cands = self.state.candidates(request.model, leg.roles, exclude, request.lora_name)
        if not cands:
            if request.lora_name is not None:
                raise NoWorkersError(
                    f"no live worker of model {request.model!r} has LoRA adapter "
                    f"{request.lora_name!r} loaded"
                )
            raise NoWorkersError(f"no live worker serves model {request.model!r}")
        if self.router is None:  # pool: any worker of the role pulls
            return self.subjects.req_pool(request.model, leg.role), None
        query = RouteQuery(request.model, request.token_ids, request.request_id, request.lora_name)
        decision = await self.router.route(query, cands)
        return self.subjects.req_worker(request.model, decision.worker_id), decision

    def check_capacity(self, model: str, leg: Leg, lora: str | None = None) -> None:
        held = self.holding.held((model, leg.roles, lora))
        bound = self.cfg.max_waiting_per_worker
        if self.state.saturated(model, leg.roles, bound, lora, held, time.monotonic()):
            raise OverloadedError(f"every worker serving {model!r} is saturated")

    async def publish(self, request: Request, subject: str, traceparent: str | None) -> None:
        headers = {"Nats-Msg-Id": routed_msg_id(request.request_id, request.attempt)}
        if traceparent:
            headers[TRACE_HEADER] = traceparent
        payload = encode(request)
        deadline = time.monotonic() + self.cfg.publish_retry_s
        delay = 0.05
        while True:
            try:
                await self.js.publish(subject, payload, headers=headers)
                return
            except (
                NoRespondersError,
                NoStreamResponseError,
                ServiceUnavailableError,
                NatsTimeoutError,
            ) as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("publish_retry", request_id=request.request_id, error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def cancel(self, request_id: str, reason: str) -> None:
        await self.nc.publish(
            self.subjects.cancel(request_id), encode(CancelRequested(request_id, reason))
        )

    async def route_request(self, request: Request, leg: Leg, hold: bool = True) -> Routed:
        """Choose the worker (and reserve it, for the kv router) without publishing: hand the
        result to ``launch``, or to ``unroute`` when the request will not go there."""
        await self._wait_for_worker(request.model, leg, request.lora_name)
        self.check_capacity(request.model, leg, request.lora_name)
        key: HoldKey = (request.model, leg.roles, request.lora_name)
        if not hold or leg.remote_prefill or not await self.holding.hold(request.priority, key):
            return await self.route(request, [], leg)
        # let go: pending in the queue until ``launch`` counts it on its worker (or it is dropped)
        self.holding.letting_go(request.request_id, key)
        try:
            # (let go because its workers all left: wait for one as a new request does)
            await self._wait_for_worker(request.model, leg, request.lora_name)
            return await self.route(request, self.holding.busy(key), leg)
        except BaseException:
            self.holding.settle(request.request_id)
            raise

    # ------------------------------------------------------------------ holding
    @property
    def held_requests(self) -> int:
        return len(self.holding)

    async def unroute(self, request_id: str) -> None:
        """Drop the reservation of a ``route_request`` whose request was not sent."""
        self.holding.settle(request_id)
        if self.router is not None:
            with contextlib.suppress(Exception):
                await self.router.finished(request_id)

    async def generate(self, request: Request, traceparent: str | None = None) -> Generation:
        """Route and publish (a disaggregated model's request: with its prefill placed); raises
        NoWorkersError / OverloadedError before anything is sent. ``traceparent`` (W3C) goes
        with every attempt's message as a NATS header."""
        state, model, lora = self.state, request.model, request.lora_name
        if not state.candidates(model, "decode", lora=lora) and not state.candidates(
            model, "prefill", lora=lora
        ):
            return await self.launch(request, traceparent, leg=self.agg)
        # a disaggregated model (decode workers, or prefill workers whose decode workers are not
        # up yet: the decode leg waits for them as the aggregated one would, unless the request
        # may run whole on a prefill worker)
        routed, placement, leg = await self._route_disagg(request)
        if leg is self.either:  # local anyway: the prefill worker runs it start to end
            placement = Placement(False, f"{placement.reason}_on_prefill")
        self._on_placement(model, placement)
        prefill: PrefillLeg | None = None
        if placement.remote:
            accepted = time.monotonic()
            try:
                pgen = await self.launch(prefill_request(request), traceparent, leg=self.prefill)
            except (NoWorkersError, OverloadedError) as exc:
                log.info("prefill_unplaced", request_id=request.request_id, error=str(exc))
                placement = Placement(False, "prefill_unavailable")
            except BaseException:  # the decode reservation must not outlive the request
                await self.unroute(request.request_id)
                raise
            else:
                prefill = PrefillLeg(pgen, self.disagg.prefill_timeout_s, accepted, self)
        disagg = ("remote" if prefill else "local", placement.reason)
        try:
            return await self.launch(request, traceparent, routed, leg, disagg, prefill)
        except BaseException:  # the reservation (and a prefill) must not outlive the request
            if prefill is not None:
                await prefill.cancel("decode_unplaced", True)
            await self.unroute(request.request_id)
            raise

    async def _route_disagg(self, request: Request) -> tuple[Routed, Placement, Leg]:
        """The worker (reserved), the placement, and the leg the request runs on: ``either``
        when the worker is a prefill worker that runs it whole (``router/disagg.py``), else
        ``decode``."""
        if self.router is not None and (
            not _prefills(request) or routes_over_both_pools(self.disagg, len(request.token_ids))
        ):
            routed = await self.route_request(request, self.either)
            placement = self._plan(request, routed[1])
            if not self._is_prefill_worker(routed[1]):
                return routed, placement, self.decode
            if stays_on_prefill_worker(placement):
                return routed, placement, self.either
            # a race (the prefill pool filled up since): the decode pool, as for a long prompt
            await self.unroute(request.request_id)
        # (not held again: it was, or found room, on the first try)
        routed = await self.route_request(request, self.decode, hold=False)
        return routed, self._plan(request, routed[1]), self.decode

    def _is_prefill_worker(self, decision: RouteDecision | None) -> bool:
        view = self.state.workers.get(decision.worker_id) if decision is not None else None
        return view is not None and view.reg.role == "prefill"

    def _plan(self, request: Request, decision: RouteDecision | None) -> Placement:
        overlap, block_size = 0, 16
        if decision is not None:
            chosen = [c for c in decision.candidates if c.worker_id == decision.worker_id]
            overlap = chosen[0].overlap_blocks if chosen else 0
            view = self.state.workers.get(decision.worker_id)
            block_size = view.reg.block_size if view is not None else block_size
        queued = [
            max(v.remote_prefills, v.load.num_waiting if v.load else 0)
            for v in self.state.candidates(request.model, "prefill", lora=request.lora_name)
        ]
        return plan(
            self.disagg, len(request.token_ids), _prefills(request), overlap, block_size, queued
        )

    async def release_prefill(self, worker_id: str, request_id: str) -> None:
        """Tell a prefill worker the blocks it holds for ``request_id``'s remote prefill may go."""
        if not worker_id:
            return
        with contextlib.suppress(Exception):
            await self.nc.publish(
                self.subjects.ctl(worker_id, "kv_release"),
                encode(kv_release(prefill_request_id(request_id))),
            )

    async def launch(
        self,
        request: Request,
        traceparent: str | None = None,
        routed: Routed | None = None,
        leg: Leg | None = None,
        disagg: tuple[str, str] = ("", ""),
        prefill: PrefillLeg | None = None,
    ) -> Generation:
        """One generation along ``leg`` (default: aggregated): routed (unless ``routed`` by
        ``route_request``) and published, or, with a ``prefill`` leg, held until it answers;
        ``disagg``: its placement, for its observation."""
        leg = leg or self.agg
        if routed is None:
            routed = await self.route_request(request, leg)
        subject, decision = routed
        if decision is not None:
            request = with_route(request, decision)
            self._on_route(decision)
        stream = TokenStream(request.request_id, self._store, request.attempt)

        async def feed(msg: Msg) -> None:
            stream.feed_wire(msg.data)

        try:
            sub = await self.nc.subscribe(self.subjects.tok(request.request_id), cb=feed)
        except BaseException:
            self.holding.settle(request.request_id)
            raise
        held = (prefill, subject) if prefill is not None else None
        gen = Generation(self, request, decision, stream, leg, traceparent, disagg, held)
        self.active[request.request_id] = _InFlight(gen, sub)
        self.moved("", gen.worker_id, leg)
        self.holding.settle(request.request_id)
        if gen.worker_id and not self.state.is_alive(gen.worker_id):
            # it left while the request was being routed, before it was in ``active``
            stream.interrupt(f"worker {gen.worker_id} left")
        if prefill is not None:
            return gen  # published once the prefill answered
        try:
            await self.publish(request, subject, traceparent)
        except BaseException:  # a cancelled caller too: no entry, count or subscription left
            await self.release(request.request_id, gen.worker_id)
            raise
        stream.published()
        return gen

    async def _wait_for_worker(self, model: str, leg: Leg, lora: str | None = None) -> None:
        deadline = time.monotonic() + self.cfg.wait_for_worker_s
        # polled: discovery has no per-model event to wait on
        while not self.state.candidates(model, leg.roles, lora=lora):
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------------ requests in flight
    def moved(self, from_worker: str, to_worker: str, leg: Leg) -> None:
        self.state.count(from_worker, -1, leg.remote_prefill)
        self.state.count(to_worker, +1, leg.remote_prefill)

    def first_token(self, request_id: str) -> None:
        """Release the prefill part of a reservation, off the token path: a slow or lost Redis
        never delays nor fails a stream (the reservation expires on its own)."""
        if self.router is not None:
            self._spawn(self._first_token(self.router, request_id))

    @staticmethod
    async def _first_token(router: Router, request_id: str) -> None:
        try:
            await router.first_token(request_id)
        except Exception as exc:
            log.warning("release_failed", request_id=request_id, part="prefill", error=str(exc))

    async def release(self, request_id: str, worker_id: str) -> None:
        """Forget a request: its reservation, in-flight count and token subscription
        (idempotent)."""
        self.holding.settle(request_id)
        entry = self.active.pop(request_id, None)
        if entry is None:
            return
        self.state.count(worker_id, -1, entry.gen.leg.remote_prefill)
        self.holding.release()
        if self.router is not None:
            try:
                await self.router.finished(request_id)
            except Exception as exc:  # the reservation expires on its own
                log.warning("release_failed", request_id=request_id, error=str(exc))
        with contextlib.suppress(Exception):
            await entry.sub.unsubscribe()

    def worker_gone(self, worker_id: str) -> None:
        """The fleet state dropped ``worker_id``: what ran there migrates."""
        for entry in self.active.values():
            if entry.gen.worker_id == worker_id:
                entry.gen.stream.interrupt(f"worker {worker_id} left")

    async def _watch(self) -> None:
        period = min(1.0, self.cfg.stall_timeout_s / 4, self.prefill.stall_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for entry in list(self.active.values()):
                gen = entry.gen
                if gen.held:  # not published yet: its prefill leg has its own clock
                    continue
                progress = self.state.progress_at(gen.worker_id)
                gen.stream.check_stall(
                    now,
                    gen.leg.stall_timeout_s,
                    progress,
                    elsewhere=partial(self._elsewhere, gen),
                    patience=0 if gen.leg.remote_prefill else gen.leg.max_attempts,
                )

    def _elsewhere(self, gen: Generation) -> bool:
        """Whether a migration could go on: an attempt is left, and a live worker the request
        has not tried could take it (its route would find one)."""
        req = gen.request
        if req.attempt + 1 >= gen.leg.max_attempts:
            return False  # the migration would give up
        tried = [*gen.tried, gen.worker_id]
        return bool(self.state.candidates(req.model, gen.leg.roles, tried, req.lora_name))

    async def catch_up(self) -> None:
        """After a NATS reconnect (a hook: returns at once, the work runs in a task): each
        request in flight reads the newest chunk stored for it (``TokenStream.catch_up``)."""
        self._spawn(self._catch_up())

    async def _catch_up(self, parallel: int = 16) -> None:
        gate = asyncio.Semaphore(parallel)

        async def one(stream: TokenStream) -> None:
            async with gate:
                await stream.catch_up()

        streams = [e.gen.stream for e in self.active.values() if not e.gen.done]
        await asyncio.gather(*(one(s) for s in streams))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _prefills(request: Request) -> bool:
    """A request with a prompt to prefill (not an embedding, not prompt embeddings)."""
    return request.task == "generate" and request.prompt_embeds is None
