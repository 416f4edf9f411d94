"""The routing library: route a tokenized request, publish it, follow its token stream.

Used by the HTTP frontend (in-process, no extra hop), the router service and ``jetfleet publish``.

Life of a request (``Generation``, ``router/generation.py``):
1. subscribe to fleet.tok.{request_id} (core NATS: it sees each chunk ahead of any consumer); the
   subscription feeds the request's ``TokenStream`` (``router/token_stream.py``);
2. choose a worker (policy) and publish the ``Request`` with ``Nats-Msg-Id = {id}:{attempt}``;
3. the generation yields chunks in ``(attempt, index)`` order, the stream dropping stale and
   duplicate ones and filling gaps from the ``FLEET_TOKENS`` stream;
4. if the worker leaves the fleet or goes silent past ``stall_timeout_s``, the stream is
   interrupted and the generation migrates: re-routed to another worker with the tokens
   generated so far appended to the prompt (attempt + 1), so the caller sees one uninterrupted
   stream; after ``max_attempts`` it ends with an error chunk.

The client is the generations' ``Dispatch``: it routes, publishes (retrying while the stream
elects a leader), cancels, keeps the in-flight count (``FleetState.count``) and releases
reservations. It learns that a worker left one way, from the fleet state (discovery removing the
worker), and then only feeds the streams of the requests on it; a stall watchdog feeds them the
time, and a NATS reconnect starts a catch-up of each.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import NoStreamResponseError, ServiceUnavailableError

from router.fleet_state import FleetState
from router.generation import Generation, NoWorkersError, OverloadedError, Routed, with_route
from router.policies import RouteQuery, Router
from router.token_stream import StoredChunks, TokenStream
from schemas import CancelRequested, Request, RouteDecision, encode
from schemas.requests import routed_msg_id
from schemas.subjects import Subjects
from schemas.trace import HEADER as TRACE_HEADER

log = structlog.get_logger("jetfleet.router")


@dataclass(frozen=True)
class ClientConfig:
    role: str = "agg"
    also_roles: tuple[str, ...] = ()
    """Workers of these roles are candidates too (a disaggregated model's local prefills may
    run on its prefill workers); the pool subject (no router) stays ``role``'s."""
    # no chunk for this long from a live worker whose engine took no step either: migrate
    stall_timeout_s: float = 60.0
    max_attempts: int = 3  # first try + migrations
    max_waiting_per_worker: int = 64  # shed when every worker holds capacity + this
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
        on_route: Callable[[RouteDecision], None] = lambda _d: None,
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.subjects = subjects
        self.state = state
        self.router = router
        self.cfg = cfg or ClientConfig()
        self._roles: tuple[str, ...] = (self.cfg.role, *self.cfg.also_roles)
        self._remote_prefills = self.cfg.role == "prefill"  # counted apart (disagg_client.py)
        self._on_route = on_route
        self._store = StoredChunks(self.js, subjects)
        self.active: dict[str, _InFlight] = {}
        self._background: set[asyncio.Task[None]] = set()  # prefill releases, catch-ups
        self._watchdog: asyncio.Task[None] | None = None
        state.on_departure(self.worker_gone)

    @property
    def max_attempts(self) -> int:
        return self.cfg.max_attempts

    def start(self) -> None:
        self._watchdog = asyncio.create_task(self._watch(), name="stall-watchdog")

    async def stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog

    # ------------------------------------------------------------------ routing
    async def route(self, request: Request, exclude: Sequence[str]) -> Routed:
        cands = self.state.candidates(request.model, self._roles, exclude, request.lora_name)
        if not cands:
            if request.lora_name is not None:
                raise NoWorkersError(
                    f"no live worker of model {request.model!r} has LoRA adapter "
                    f"{request.lora_name!r} loaded"
                )
            raise NoWorkersError(f"no live worker serves model {request.model!r}")
        if self.router is None:  # pool: any worker of the role pulls
            return self.subjects.req_pool(request.model, self.cfg.role), None
        query = RouteQuery(request.model, request.token_ids, request.request_id, request.lora_name)
        decision = await self.router.route(query, cands)
        return self.subjects.req_worker(request.model, decision.worker_id), decision

    def check_capacity(self, model: str, lora: str | None = None) -> None:
        if self.state.saturated(model, self._roles, self.cfg.max_waiting_per_worker, lora):
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

    async def route_request(self, request: Request) -> Routed:
        """Choose the worker (and reserve it, for the kv router) without publishing: hand the
        result to ``generate``, or to ``unroute`` when the request will not go there."""
        await self._wait_for_worker(request.model, request.lora_name)
        self.check_capacity(request.model, request.lora_name)
        return await self.route(request, [])

    async def unroute(self, request_id: str) -> None:
        """Drop the reservation of a ``route_request`` whose request was not sent."""
        if self.router is not None:
            with contextlib.suppress(Exception):
                await self.router.finished(request_id)

    async def generate(
        self,
        request: Request,
        traceparent: str | None = None,
        routed: Routed | None = None,
        disagg: tuple[str, str] = ("", ""),
    ) -> Generation:
        """Route (unless ``routed`` by ``route_request``) and publish; raises NoWorkersError /
        OverloadedError before anything is sent. ``traceparent`` (W3C) goes with every attempt's
        message as a NATS header; ``disagg``: the generation's placement, for its observation."""
        if routed is None:
            routed = await self.route_request(request)
        subject, decision = routed
        if decision is not None:
            request = with_route(request, decision)
            self._on_route(decision)
        stream = TokenStream(request.request_id, self._store, request.attempt)

        async def feed(msg: Msg) -> None:
            stream.feed_wire(msg.data)

        sub = await self.nc.subscribe(self.subjects.tok(request.request_id), cb=feed)
        gen = Generation(self, request, decision, stream, traceparent, disagg)
        self.active[request.request_id] = _InFlight(gen, sub)
        self.moved("", gen.worker_id)
        if gen.worker_id and not self.state.is_alive(gen.worker_id):
            # it left while the request was being routed, before it was in ``active``
            stream.interrupt(f"worker {gen.worker_id} left")
        try:
            await self.publish(request, subject, traceparent)
        except BaseException:  # a cancelled caller too: no entry, count or subscription left
            await self.release(request.request_id, gen.worker_id)
            raise
        stream.published()
        return gen

    async def _wait_for_worker(self, model: str, lora: str | None = None) -> None:
        deadline = time.monotonic() + self.cfg.wait_for_worker_s
        # polled: discovery has no per-model event to wait on
        while not self.state.candidates(model, self._roles, lora=lora):
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------------ requests in flight
    def moved(self, from_worker: str, to_worker: str) -> None:
        self.state.count(from_worker, -1, self._remote_prefills)
        self.state.count(to_worker, +1, self._remote_prefills)

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
        entry = self.active.pop(request_id, None)
        if entry is None:
            return
        self.state.count(worker_id, -1, self._remote_prefills)
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
        while True:
            await asyncio.sleep(min(1.0, self.cfg.stall_timeout_s / 4))
            now = time.monotonic()
            for entry in list(self.active.values()):
                progress = self.state.progress_at(entry.gen.worker_id)
                entry.gen.stream.check_stall(now, self.cfg.stall_timeout_s, progress)

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
