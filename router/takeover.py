"""A request another process started, taken over: its answer so far from ``FLEET_TOKENS``, then
a new attempt that continues from it.

A background response whose frontend died is run on by another (``router/frontend/
responses_background.py``). Everything it had is in the streams: the chunks its worker published
(``FLEET_TOKENS``, read by the wire contract's ``TokenReader``: repeats and an older attempt's
late chunks dropped, a migration's cut applied). The taker stops the attempt in flight (its
worker may still be generating for nobody), reads the answer so far, and, unless it is whole,
publishes the next attempt: the prompt plus the tokens so far, the budget left (the migration
path, ``generation.migrated_request``). ``TakenOver`` then yields the stored chunks and the new
attempt's, as one generation: the frontend's output path turns them into the same events the
first frontend would have (it is deterministic in the chunks), and a seeded request on an
engine that samples by position (the mocker) gives the same tokens too.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import msgspec
from nats.js import JetStreamContext, api

from router.generation import Generation, migrated_request
from schemas import Request, TokenChunk, decode
from schemas.subjects import Subjects
from schemas.token_reader import TokenReader


class TakeoverError(RuntimeError):
    """The answer so far cannot be read back whole (chunks past retention, or missing)."""


async def answer_so_far(js: JetStreamContext, subjects: Subjects, request_id: str) -> TokenReader:
    """Every chunk ``FLEET_TOKENS`` holds for the request, through a ``TokenReader``."""
    stream = subjects.stream_name("TOKENS")
    subject = subjects.tok(request_id)
    reader = TokenReader()
    info = await js.stream_info(stream, subjects_filter=subject)
    total = sum((info.state.subjects or {}).values())
    if total == 0:
        return reader
    sub = await js.subscribe(
        subject, stream=stream, ordered_consumer=True, deliver_policy=api.DeliverPolicy.ALL
    )
    try:
        for _ in range(total):
            msg = await sub.next_msg(timeout=5)
            reader.take(decode(msg.data, TokenChunk))
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    if reader.missing():
        raise TakeoverError(f"chunks {reader.missing()[:4]} of {request_id} are not stored")
    return reader


def next_request(request: Request, reader: TokenReader) -> Request | None:
    """The attempt that continues ``request`` (its first attempt, as sent) from what ``reader``
    holds; None when the answer is whole or its budget spent."""
    if reader.final is not None:
        return None
    generated = reader.token_ids
    remaining = request.sampling.max_tokens - len(generated)
    if remaining <= 0:
        return None
    nxt = migrated_request(request, len(request.token_ids), generated, remaining)
    return msgspec.structs.replace(nxt, attempt=max(reader.attempt, 0) + 1)


class TakenOver:
    """The stored chunks, then those of ``live`` (the new attempt; None: the answer is whole).
    Stands where a ``Generation`` does in the frontend's output path."""

    prefill_worker_id = ""
    prefill_s = 0.0
    disagg = ""
    disagg_reason = ""
    kv_transfer_ms = 0.0
    decision = None

    def __init__(self, request: Request, stored: list[TokenChunk], live: Generation | None):
        self.request = request
        self.prompt_len = len(request.token_ids)
        self.stored = stored
        self.live = live
        self.generated: list[int] = []
        self.cached_tokens = 0
        self.host_cached_tokens = 0
        self.worker_id = stored[-1].worker_id if stored else ""
        self._done = False
        if live is not None:  # it counts every token of the answer, as a migrated one does
            live.prompt_len = self.prompt_len
            live.generated = [t for c in stored for t in c.token_ids]

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def attempts(self) -> int:
        return self.live.attempts if self.live is not None else self.request.attempt + 1

    @property
    def pending(self) -> bool:
        return self.live.pending if self.live is not None else False

    def __aiter__(self) -> AsyncIterator[TokenChunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[TokenChunk]:
        for chunk in self.stored:
            self._take(chunk)
            yield chunk
            if chunk.finish_reason is not None:
                return
        if self.live is None:
            return
        async for chunk in self.live:
            self._take(chunk)
            self.worker_id = self.live.worker_id
            yield chunk

    def _take(self, chunk: TokenChunk) -> None:
        self.generated.extend(chunk.token_ids)
        if chunk.usage is not None:
            self.cached_tokens = chunk.usage.cached_tokens
            self.host_cached_tokens = chunk.usage.host_cached_tokens

    async def cancel(self, reason: str = "client_disconnected", stop_worker: bool = True) -> None:
        if self.live is not None:
            await self.live.cancel(reason, stop_worker)
