"""One request in flight: its attempts, its migrations, what it has generated.

A ``Generation`` is iterated for the request's ``TokenChunk``s. It reads them from its
``TokenStream`` (ordered, gap-filled) and, when the stream says the current attempt cannot go on
(``Interrupted``: the worker left, stalled, lost chunks), migrates: ``next_attempt`` decides
between the next attempt (the prompt plus the tokens generated so far, the budget left) and a
final chunk (attempts exhausted, budget spent, a prompt of embeddings that cannot be resent),
then the generation routes and publishes the new attempt through its ``Dispatch`` (the
``FleetClient`` that made it), excluding the workers already tried. The caller sees one
uninterrupted stream.

The ``Dispatch`` is the only way out: routing, publishing, cancelling, the in-flight count and
the reservation's release. The client never changes a generation; it feeds its stream. Each
generation is routed along its ``Leg`` (the workers' roles it may go to, its attempts and stall
timeout).

A disaggregated request's generation has a **prefill leg** (``router/prefill_leg.py``): its first
attempt is routed (reserved) but held until the remote prefill answers, then published with the
prefill's KV transfer parameters (its worker pulls the prompt's KV), or without them when the
prefill gave no answer (its worker prefills itself: ``disagg`` ``local``, with the reason).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import msgspec
import structlog

from router.prefill_leg import PrefillLeg
from router.token_stream import Interrupted, TokenStream
from schemas import Request, RouteDecision, SamplingParams, TokenChunk
from schemas.tokens import error_chunk

log = structlog.get_logger("jetfleet.router")


class NoWorkersError(RuntimeError):
    """No live worker serves the model (or every one was tried)."""


class OverloadedError(RuntimeError):
    """Every worker is saturated past the configured bound: shed, retry later."""


Routed = tuple[str, RouteDecision | None]  # the subject to publish on, the decision (pool: None)


@dataclass(frozen=True)
class Leg:
    """How a generation is routed and followed."""

    role: str  # the pool subject's role (no router: any worker of the role pulls)
    roles: tuple[str, ...]  # the candidates' roles
    max_attempts: int  # first try + migrations
    stall_timeout_s: float  # no chunk for this long from a worker making no progress: migrate
    remote_prefill: bool = False  # counted apart in the fleet state (the saturation rule)


class Dispatch(Protocol):
    """What a generation asks of the client that made it."""

    async def route(self, request: Request, exclude: Sequence[str], leg: Leg) -> Routed:
        """Raises ``NoWorkersError``, or whatever the routing backend raises."""
        ...

    async def publish(self, request: Request, subject: str, traceparent: str | None) -> None: ...

    async def cancel(self, request_id: str, reason: str) -> None:
        """Tell the worker to stop (a lost message is tolerated)."""
        ...

    def moved(self, from_worker: str, to_worker: str, leg: Leg) -> None:
        """The request's current attempt now runs on ``to_worker`` ("" : not known yet)."""
        ...

    def first_token(self, request_id: str) -> None: ...

    async def release(self, request_id: str, worker_id: str) -> None:
        """The request is over: its reservation, in-flight count and subscription go."""
        ...


class Generation:
    """One request in flight; iterate it for its ``TokenChunk``s."""

    def __init__(
        self,
        dispatch: Dispatch,
        request: Request,
        decision: RouteDecision | None,
        stream: TokenStream,
        leg: Leg,
        traceparent: str | None = None,
        disagg: tuple[str, str] = ("", ""),
        prefill: tuple[PrefillLeg, str] | None = None,
    ) -> None:
        """``disagg``: (placement, reason) of a disaggregated fleet's request; ``prefill``: its
        remote prefill and the subject its first attempt goes to once the prefill answered."""
        self.request = request  # the current attempt
        self.prompt_len = len(request.token_ids)
        self.decision = decision
        self.worker_id = decision.worker_id if decision else ""
        self.tried: list[str] = [self.worker_id] if self.worker_id else []
        self.generated: list[int] = []
        self.cached_tokens = 0
        self.host_cached_tokens = 0
        self.kv_transfer_ms = 0.0  # a remote prefill's KV pulled in (a disaggregated decode)
        self.traceparent = traceparent
        self.disagg, self.disagg_reason = disagg
        self.stream = stream
        self.leg = leg
        self.prefill_worker_id = ""  # a remote prefill's worker, once it answered
        self.prefill_s = 0.0  # accepted to the remote prefill's answer
        self._dispatch = dispatch
        self._prefill: PrefillLeg | None = prefill[0] if prefill is not None else None
        self._held_subject = prefill[1] if prefill is not None else ""
        self._answered: PrefillLeg | None = None  # a prefill whose blocks the decode pulls
        self._released = False  # its reservation and in-flight count given back

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def attempts(self) -> int:
        return self.request.attempt + 1

    @property
    def done(self) -> bool:
        return self.stream.ended

    @property
    def pending(self) -> bool:
        """Chunks have arrived that the iteration has not reached yet."""
        return self.stream.pending

    @property
    def held(self) -> bool:
        """The first attempt waits for the remote prefill: nothing of it is published yet."""
        return self._prefill is not None

    def __aiter__(self) -> AsyncIterator[TokenChunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[TokenChunk]:
        try:
            if self._prefill is not None:
                failed = await self._after_prefill(self._prefill)
                if failed is not None:
                    self.stream.end()
                    yield failed
            while not self.done:
                event = await self.stream.next()
                if isinstance(event, Interrupted):
                    final = await self._migrate(event.reason)
                    if final is not None:
                        self.stream.end()
                        yield final
                    continue
                self._take(event)
                if event.finish_reason is not None:
                    self.stream.end()
                    # before the caller sees the end: a client's next request (a conversation's
                    # next turn) is routed on a fleet that no longer counts this one
                    await self._release()
                yield event
        finally:
            await self._release()

    async def _release(self) -> None:
        if self._released:
            return
        self._released = True
        await self._dispatch.release(self.request_id, self.worker_id)
        if self._answered is not None:
            # Normally the decode worker already told the prefill worker it pulled the KV; if
            # it died first (or the request ended early), this frees the held blocks now rather
            # than at the hold timeout.
            await self._answered.release(self.request_id)

    async def _after_prefill(self, leg: PrefillLeg) -> TokenChunk | None:
        """The remote prefill's answer, then the first attempt out; a final chunk when it
        could not be published."""
        first = await leg.answer(self.request_id)
        self._prefill = None
        self.prefill_worker_id, self.prefill_s = leg.worker_id, leg.seconds
        if self.done:  # cancelled while its prefill ran: nothing goes out, its blocks go
            if first is not None:
                await leg.release(self.request_id)
            return None
        if first is None:
            self.disagg, self.disagg_reason = "local", leg.failure
        else:
            self._answered = leg
            self.request = msgspec.structs.replace(
                self.request, kv_transfer_params=dict(first.kv_transfer_params or {})
            )
        try:
            await self._dispatch.publish(self.request, self._held_subject, self.traceparent)
        except Exception as exc:
            return self._attempt_failed(self.request, f"could not publish: {exc}")
        self.stream.published()
        return None

    def _take(self, chunk: TokenChunk) -> None:
        if chunk.index == 0:
            self._dispatch.first_token(self.request_id)
        if not self.worker_id and chunk.worker_id:  # pool routing: learn who pulled it
            self._move(chunk.worker_id)
        self.generated.extend(chunk.token_ids)
        if chunk.usage is not None:
            self.cached_tokens = chunk.usage.cached_tokens
            self.host_cached_tokens = chunk.usage.host_cached_tokens
            self.kv_transfer_ms = chunk.usage.kv_transfer_ms

    def _move(self, worker_id: str) -> None:
        self._dispatch.moved(self.worker_id, worker_id, self.leg)
        self.worker_id = worker_id

    async def _migrate(self, reason: str) -> TokenChunk | None:
        """Re-route the request; returns a final chunk when it cannot go on."""
        old = self.request
        log.warning(
            "request_migrating",
            request_id=old.request_id,
            worker_id=self.worker_id,
            attempt=old.attempt,
            reason=reason,
            generated=len(self.generated),
        )
        nxt = next_attempt(old, self.prompt_len, self.generated, self.leg.max_attempts, reason)
        if isinstance(nxt, TokenChunk):
            return msgspec.structs.replace(nxt, index=self.stream.next_index)
        with contextlib.suppress(Exception):  # tell a stalled (not dead) worker to stop
            await self._dispatch.cancel(old.request_id, "migrated")
        self._move("")
        self.request = nxt
        self.stream.begin_attempt(nxt.attempt)
        try:
            subject, decision = await self._dispatch.route(nxt, self.tried, self.leg)
        except NoWorkersError as exc:
            return self._attempt_failed(nxt, f"{reason}; {exc}")
        except Exception as exc:  # routing backend down (Redis): end clearly, not with a hang
            log.error("migration_routing_failed", request_id=old.request_id, error=str(exc))
            return self._attempt_failed(nxt, f"{reason}; routing failed: {exc}")
        if decision is not None:
            self.request = with_route(nxt, decision)
            self.decision = decision
            self.tried.append(decision.worker_id)
            self._move(decision.worker_id)
        try:
            await self._dispatch.publish(self.request, subject, self.traceparent)
        except Exception as exc:
            return self._attempt_failed(nxt, f"{reason}; could not republish: {exc}")
        self.stream.published()
        return None

    def _attempt_failed(self, nxt: Request, error: str) -> TokenChunk:
        """The chunk that ends a new attempt before it ran: the first of its attempt, so it says
        what the attempt continued from (a NATS reader cuts an older attempt's late chunks)."""
        chunk = error_chunk(nxt.request_id, nxt.attempt, 0, error)
        return msgspec.structs.replace(chunk, generated_before=nxt.num_generated_before)

    async def cancel(self, reason: str = "client_disconnected", stop_worker: bool = True) -> None:
        """Stop the worker and let the request go (its reservation, in-flight count and
        subscription too, also when it was never iterated). The caller stops iterating.
        ``stop_worker=False``: let the request go here only (another process has taken it over
        and runs it on: a cancel would stop its attempt too)."""
        if self.done:
            return
        self.stream.end()
        try:
            if self._prefill is not None:
                await self._prefill.cancel(reason, stop_worker)
                self._prefill = None
            if stop_worker:
                await self._dispatch.cancel(self.request_id, reason)
        finally:
            await self._release()


def next_attempt(
    request: Request, prompt_len: int, generated: Sequence[int], max_attempts: int, reason: str
) -> Request | TokenChunk:
    """What follows an attempt interrupted by ``reason``: the next attempt's request, or the
    chunk that ends the request (its ``index`` is the caller's to set). Pure."""
    remaining = request.sampling.max_tokens - (len(generated) - request.num_generated_before)
    rid, attempt = request.request_id, request.attempt
    if attempt + 1 >= max_attempts:
        return error_chunk(rid, attempt, 0, f"gave up after {attempt + 1} attempts: {reason}")
    if remaining <= 0:  # the budget is spent: the answer is whole, cut at its length
        return TokenChunk(rid, attempt, 0, finish_reason="length")
    if request.prompt_embeds is not None and generated:
        return error_chunk(
            rid,
            attempt,
            0,
            f"{reason}; a request with prompt_embeds cannot continue on another worker once it "
            "has generated (its prompt has no tokens to resend)",
        )
    return migrated_request(request, prompt_len, generated, remaining)


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


def with_route(request: Request, decision: RouteDecision) -> Request:
    return msgspec.structs.replace(request, route=decision)


def _with_max_tokens(sampling: SamplingParams, max_tokens: int) -> SamplingParams:
    return msgspec.structs.replace(sampling, max_tokens=max_tokens, min_tokens=0)
