"""The routing library: route a tokenized request, publish it, follow its token stream.

Used by the HTTP frontend (in-process, no extra hop), the router service and ``jetfleet publish``.

Life of a request (``Generation``):
1. subscribe to fleet.tok.{request_id} (core NATS: it sees each chunk ahead of any consumer);
2. choose a worker (policy) and publish the ``Request`` with ``Nats-Msg-Id = {id}:{attempt}``;
3. yield chunks in ``(attempt, index)`` order, dropping stale and duplicate ones; a gap is filled
   from the ``FLEET_TOKENS`` stream;
4. if the worker leaves discovery or goes silent past ``stall_timeout_s``, migrate: re-route to
   another worker with the tokens generated so far appended to the prompt (attempt + 1), so the
   caller sees one uninterrupted stream; after ``max_attempts`` it ends with an error chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import msgspec
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import api
from nats.js.errors import NoStreamResponseError, ServiceUnavailableError

from router.fleet_state import FleetState, WorkerView
from router.policies import RouteQuery, Router
from schemas import (
    CancelRequested,
    Request,
    RequestObservation,
    RouteDecision,
    SamplingParams,
    TokenChunk,
    WireDecodeError,
    decode,
    encode,
)
from schemas.requests import routed_msg_id
from schemas.subjects import Subjects
from schemas.tokens import error_chunk
from schemas.trace import HEADER as TRACE_HEADER

log = structlog.get_logger("jetfleet.router")


class NoWorkersError(RuntimeError):
    """No live worker serves the model (or every one was tried)."""


class OverloadedError(RuntimeError):
    """Every worker is saturated past the configured bound: shed, retry later."""


@dataclass(frozen=True)
class ClientConfig:
    role: str = "agg"
    also_roles: tuple[str, ...] = ()
    """Workers of these roles are candidates too (a disaggregated model's local prefills may
    run on its prefill workers); the pool subject (no router) stays ``role``'s."""
    stall_timeout_s: float = 60.0  # no chunk for this long from a live worker: migrate
    max_attempts: int = 3  # first try + migrations
    max_waiting_per_worker: int = 64  # shed when every worker holds capacity + this
    wait_for_worker_s: float = 5.0  # with no live worker for the model, wait this long, then 503
    publish_retry_s: float = 10.0
    """A request the stream does not confirm (its leader moved: a NATS node lost, an election)
    is published again, with backoff, for up to this long before the client hears 503 (the
    message id makes a retry of a stored one a no-op)."""


@dataclass(frozen=True, slots=True)
class _Migrate:
    reason: str
    attempt: int  # the attempt it is about: once migrated, a later notice is stale


class Generation:
    """One request in flight; iterate it for its ``TokenChunk``s."""

    def __init__(self, client: FleetClient, request: Request, decision: RouteDecision | None):
        self.client = client
        self.request = request  # the current attempt
        self.prompt_len = len(request.token_ids)
        self.decision = decision
        self.worker_id = decision.worker_id if decision else ""
        self.tried: list[str] = [self.worker_id] if self.worker_id else []
        self.generated: list[int] = []
        self.cached_tokens = 0
        self.host_cached_tokens = 0
        self.next_index = 0
        self.last_activity = time.monotonic()
        self.queue: asyncio.Queue[TokenChunk | _Migrate] = asyncio.Queue()
        self.sub: Subscription | None = None
        self.traceparent: str | None = None
        self.done = False
        self.disagg = ""  # "local" when a disaggregated fleet chose to prefill on the decoder
        self.disagg_reason = ""

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def attempts(self) -> int:
        return self.request.attempt + 1

    async def on_message(self, msg: Msg) -> None:
        try:
            self.queue.put_nowait(decode(msg.data, TokenChunk))
        except WireDecodeError as exc:
            log.warning("bad_token_chunk", request_id=self.request_id, error=str(exc))

    def __aiter__(self) -> AsyncIterator[TokenChunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[TokenChunk]:
        try:
            while not self.done:
                item = await self.queue.get()
                if isinstance(item, _Migrate):
                    if item.attempt != self.request.attempt:
                        continue  # about an attempt already migrated away from
                    final = await self.client.migrate(self, item.reason)
                    if final is not None:
                        self.done = True
                        yield final
                    continue
                for chunk in await self._accept(item):
                    self.last_activity = time.monotonic()
                    if chunk.index == 0 and self.client.router is not None:
                        self.client.first_token(self.request_id)
                    if not self.worker_id:
                        self.worker_id = chunk.worker_id  # pool routing: learn who pulled it
                    self.generated.extend(chunk.token_ids)
                    if chunk.usage is not None:
                        self.cached_tokens = chunk.usage.cached_tokens
                        self.host_cached_tokens = chunk.usage.host_cached_tokens
                    if chunk.finish_reason is not None:
                        self.done = True
                    yield chunk
                    if self.done:
                        break
        finally:
            await self.client.release(self)

    async def _accept(self, chunk: TokenChunk) -> list[TokenChunk]:
        """Chunks to deliver now, in order (fills a gap from the stream if one shows)."""
        if chunk.attempt != self.request.attempt or chunk.index < self.next_index:
            return []  # stale attempt or duplicate
        if chunk.index > self.next_index:
            missing = await self.client.recover(self, chunk.index)
            if missing is None:
                self.queue.put_nowait(_Migrate("lost token chunks", self.request.attempt))
                return []
            out = [*missing, chunk]
        else:
            out = [chunk]
        self.next_index = out[-1].index + 1
        return out

    def observation(
        self,
        *,
        status: str,
        accepted: float,
        first_at: float,
        last_at: float,
        source: str,
        finish_reason: str | None = None,
        error: str | None = None,
    ) -> RequestObservation:
        """What the planner and the replay tools learn about this request, from the monotonic
        times it was accepted, gave its first token and its last (0.0: never)."""
        osl = len(self.generated)
        end = last_at or time.monotonic()
        return RequestObservation(
            request_id=self.request_id,
            model=self.request.model,
            status=status,
            ts_s=time.time(),
            worker_id=self.worker_id,
            isl_tokens=self.prompt_len,
            osl_tokens=osl,
            cached_tokens=self.cached_tokens,
            host_cached_tokens=self.host_cached_tokens,
            ttft_s=(first_at - accepted) if first_at else 0.0,
            itl_s=(last_at - first_at) / (osl - 1) if osl > 1 and first_at and last_at else 0.0,
            e2e_s=end - accepted,
            attempts=self.attempts,
            finish_reason=finish_reason,
            error=error,
            route=self.decision,
            frontend_id=source,
            disagg=self.disagg,
            disagg_reason=self.disagg_reason,
        )

    async def cancel(self, reason: str = "client_disconnected") -> None:
        if self.done:
            return
        self.done = True
        await self.client.nc.publish(
            self.client.subjects.cancel(self.request_id),
            encode(CancelRequested(self.request_id, reason)),
        )


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
        self._on_route = on_route
        self.active: dict[str, Generation] = {}
        self._background: set[asyncio.Task[None]] = set()  # prefill releases in flight
        self._watchdog: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._watchdog = asyncio.create_task(self._watch(), name="stall-watchdog")

    async def stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog

    # ------------------------------------------------------------------ routing
    async def _route(
        self, request: Request, exclude: list[str]
    ) -> tuple[str, RouteDecision | None]:
        cands = self.state.candidates(request.model, self._roles, exclude)
        if not cands:
            raise NoWorkersError(f"no live worker serves model {request.model!r}")
        if self.router is None:  # pool: any worker of the role pulls
            return self.subjects.req_pool(request.model, self.cfg.role), None
        query = RouteQuery(request.model, request.token_ids, request.request_id, request.lora_name)
        decision = await self.router.route(query, cands)
        return self.subjects.req_worker(request.model, decision.worker_id), decision

    def check_capacity(self, model: str) -> None:
        if self.state.saturated(model, self._roles, self.cfg.max_waiting_per_worker):
            raise OverloadedError(f"every worker serving {model!r} is saturated")

    def _view(self, worker_id: str) -> WorkerView | None:
        return self.state.workers.get(worker_id)

    async def _publish(self, gen: Generation, subject: str) -> None:
        req = gen.request
        headers = {"Nats-Msg-Id": routed_msg_id(req.request_id, req.attempt)}
        if gen.traceparent:
            headers[TRACE_HEADER] = gen.traceparent
        payload = encode(req)
        deadline = time.monotonic() + self.cfg.publish_retry_s
        delay = 0.05
        while True:
            try:
                await self.js.publish(subject, payload, headers=headers)
                break
            except (
                NoRespondersError,
                NoStreamResponseError,
                ServiceUnavailableError,
                NatsTimeoutError,
            ) as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("publish_retry", request_id=req.request_id, error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        gen.last_activity = time.monotonic()

    async def route_request(self, request: Request) -> tuple[str, RouteDecision | None]:
        """Choose the worker (and reserve it, for the kv router) without publishing: hand the
        result to ``generate``, or to ``unroute`` when the request will not go there."""
        await self._wait_for_worker(request.model)
        self.check_capacity(request.model)
        return await self._route(request, [])

    async def unroute(self, request_id: str) -> None:
        """Drop the reservation of a ``route_request`` whose request was not sent."""
        if self.router is not None:
            with contextlib.suppress(Exception):
                await self.router.finished(request_id)

    async def generate(
        self,
        request: Request,
        traceparent: str | None = None,
        routed: tuple[str, RouteDecision | None] | None = None,
    ) -> Generation:
        """Route (unless ``routed`` by ``route_request``) and publish; raises NoWorkersError /
        OverloadedError before anything is sent. ``traceparent`` (W3C) goes with every attempt's
        message as a NATS header."""
        if routed is None:
            routed = await self.route_request(request)
        subject, decision = routed
        if decision is not None:
            request = _with_route(request, decision)
            self._on_route(decision)
        gen = Generation(self, request, decision)
        gen.traceparent = traceparent
        gen.sub = await self.nc.subscribe(self.subjects.tok(request.request_id), cb=gen.on_message)
        self.active[request.request_id] = gen
        self._count(gen.worker_id, +1)
        try:
            await self._publish(gen, subject)
        except BaseException:  # a cancelled caller too: no entry, count or subscription left
            await self.release(gen)
            raise
        return gen

    def in_flight_on(self, worker_id: str) -> int:
        """This client's requests whose current attempt runs on ``worker_id``."""
        return sum(g.worker_id == worker_id for g in self.active.values())

    async def _wait_for_worker(self, model: str) -> None:
        deadline = time.monotonic() + self.cfg.wait_for_worker_s
        # polled: discovery has no per-model event to wait on
        while not self.state.candidates(model, self._roles):
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.05)

    def _count(self, worker_id: str, delta: int) -> None:
        view = self._view(worker_id) if worker_id else None
        if view is not None:
            view.in_flight = max(view.in_flight + delta, 0)

    def first_token(self, request_id: str) -> None:
        """Release the prefill part of a reservation, off the token path: a slow or lost Redis
        never delays nor fails a stream (the reservation expires on its own)."""
        task = asyncio.create_task(self._first_token(request_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _first_token(self, request_id: str) -> None:
        assert self.router is not None
        try:
            await self.router.first_token(request_id)
        except Exception as exc:
            log.warning("release_failed", request_id=request_id, part="prefill", error=str(exc))

    async def release(self, gen: Generation) -> None:
        """Forget ``gen``: its reservation, in-flight count and token subscription (idempotent)."""
        if self.active.pop(gen.request_id, None) is None:
            return
        self._count(gen.worker_id, -1)
        if self.router is not None:
            try:
                await self.router.finished(gen.request_id)
            except Exception as exc:  # the reservation expires on its own
                log.warning("release_failed", request_id=gen.request_id, error=str(exc))
        if gen.sub is not None:
            with contextlib.suppress(Exception):
                await gen.sub.unsubscribe()

    # ------------------------------------------------------------------ migration
    async def migrate(self, gen: Generation, reason: str) -> TokenChunk | None:
        """Re-route ``gen``; returns a final error chunk when it cannot go on."""
        old = gen.request
        log.warning(
            "request_migrating",
            request_id=old.request_id,
            worker_id=gen.worker_id,
            attempt=old.attempt,
            reason=reason,
            generated=len(gen.generated),
        )
        remaining = old.sampling.max_tokens - (len(gen.generated) - old.num_generated_before)
        if old.attempt + 1 >= self.cfg.max_attempts:
            return _error_chunk(
                old, gen.next_index, f"gave up after {old.attempt + 1} attempts: {reason}"
            )
        if remaining <= 0:
            # the budget is spent: the answer is whole, cut at its length
            return TokenChunk(old.request_id, old.attempt, gen.next_index, finish_reason="length")
        if old.prompt_embeds is not None and gen.generated:
            return _error_chunk(
                old,
                gen.next_index,
                f"{reason}; a request with prompt_embeds cannot continue on another worker "
                "once it has generated (its prompt has no tokens to resend)",
            )
        with contextlib.suppress(Exception):  # tell a stalled (not dead) worker to stop
            await self.nc.publish(
                self.subjects.cancel(old.request_id),
                encode(CancelRequested(old.request_id, "migrated")),
            )
        self._count(gen.worker_id, -1)
        new_req = migrated_request(old, gen.prompt_len, gen.generated, remaining)
        gen.request = new_req
        gen.next_index = 0
        try:
            subject, decision = await self._route(new_req, gen.tried)
        except NoWorkersError as exc:
            return _error_chunk(new_req, 0, f"{reason}; {exc}")
        except Exception as exc:  # routing backend down (Redis): end clearly, not with a hang
            log.error("migration_routing_failed", request_id=old.request_id, error=str(exc))
            return _error_chunk(new_req, 0, f"{reason}; routing failed: {exc}")
        if decision is not None:
            gen.request = _with_route(new_req, decision)
            gen.decision = decision
            gen.worker_id = decision.worker_id
            gen.tried.append(decision.worker_id)
        else:
            gen.worker_id = ""
        self._count(gen.worker_id, +1)
        try:
            await self._publish(gen, subject)
        except Exception as exc:
            return _error_chunk(gen.request, 0, f"{reason}; could not republish: {exc}")
        return None

    def worker_gone(self, worker_id: str) -> None:
        for gen in self.active.values():
            if gen.worker_id == worker_id and not gen.done:
                gen.queue.put_nowait(_Migrate(f"worker {worker_id} left", gen.request.attempt))

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.cfg.stall_timeout_s / 4))
            now = time.monotonic()
            for gen in list(self.active.values()):
                if gen.done:
                    continue
                if gen.worker_id and not self.state.is_alive(gen.worker_id):
                    reason = f"worker {gen.worker_id} expired"
                    gen.queue.put_nowait(_Migrate(reason, gen.request.attempt))
                    gen.last_activity = now
                elif now - gen.last_activity > self.cfg.stall_timeout_s:
                    gen.queue.put_nowait(_Migrate("stalled", gen.request.attempt))
                    gen.last_activity = now

    async def catch_up(self) -> None:
        """After a NATS reconnect (a hook: returns at once, the work runs in a task): the chunks
        published while this process was away reached only FLEET_TOKENS. Each request in
        flight whose stream holds a chunk it has not seen gets that newest chunk, and the gap
        before it is filled from the stream as any gap is, so a request whose last chunk was
        missed ends now, not at its stall timeout."""
        task = asyncio.create_task(self._catch_up())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _catch_up(self, timeout_s: float = 1.0, parallel: int = 16) -> None:
        stream = self.subjects.stream_name("TOKENS")
        gate = asyncio.Semaphore(parallel)

        async def one(gen: Generation) -> None:
            async with gate:
                try:
                    last = await asyncio.wait_for(
                        self.js.get_last_msg(stream, self.subjects.tok(gen.request_id)), timeout_s
                    )
                    chunk = decode(last.data or b"", TokenChunk)
                except Exception:  # nothing stored for it (yet), or the stream is electing
                    return
            if chunk.attempt == gen.request.attempt and chunk.index >= gen.next_index:
                gen.queue.put_nowait(chunk)

        await asyncio.gather(*(one(g) for g in list(self.active.values()) if not g.done))

    async def recover(self, gen: Generation, upto: int) -> list[TokenChunk] | None:
        """Read chunks ``gen.next_index .. upto-1`` of the current attempt from FLEET_TOKENS."""
        want = set(range(gen.next_index, upto))
        found: dict[int, TokenChunk] = {}
        sub = None
        try:  # any failure (the stream electing a leader, a timeout): None, and it migrates
            sub = await self.js.subscribe(
                self.subjects.tok(gen.request_id),
                stream=self.subjects.stream_name("TOKENS"),
                ordered_consumer=True,
                deliver_policy=api.DeliverPolicy.ALL,
            )
            while want - found.keys():
                msg = await sub.next_msg(timeout=1.0)
                chunk = decode(msg.data, TokenChunk)
                if chunk.attempt == gen.request.attempt and chunk.index in want:
                    found[chunk.index] = chunk
        except Exception as exc:
            log.warning("chunk_recovery_failed", request_id=gen.request_id, error=str(exc))
            return None
        finally:
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
        return [found[i] for i in sorted(found)]


def _with_route(request: Request, decision: RouteDecision) -> Request:
    import msgspec

    return msgspec.structs.replace(request, route=decision)


def migrated_request(
    old: Request, prompt_len: int, generated: Sequence[int], remaining: int
) -> Request:
    """The next attempt of ``old``: the prompt plus what was generated, the budget left; every
    other field (task, detokenizing, constraints, logprobs, ...) kept. The route and KV transfer
    parameters belonged to the old worker and are dropped."""
    return msgspec.structs.replace(
        old,
        token_ids=tuple(old.token_ids[:prompt_len]) + tuple(generated),
        sampling=_with_max_tokens(old.sampling, remaining),
        attempt=old.attempt + 1,
        num_generated_before=len(generated),
        route=None,
        kv_transfer_params=None,
    )


def _with_max_tokens(sampling: SamplingParams, max_tokens: int) -> SamplingParams:
    return msgspec.structs.replace(sampling, max_tokens=max_tokens, min_tokens=0)


def _error_chunk(req: Request, index: int, error: str) -> TokenChunk:
    return error_chunk(req.request_id, req.attempt, index, error)
