"""One request's token stream as its reader sees it: in order, without gaps, across attempts.

Chunks reach a stream from three places, and the stream alone decides what they mean:

- the token subscription (core NATS on ``fleet.tok.{request_id}``: it sees each chunk ahead of
  any JetStream consumer), fed chunk by chunk;
- a catch-up after a NATS reconnect (``catch_up``): the newest chunk ``FLEET_TOKENS`` holds for
  the request, when the stream has not seen it (chunks published while this process was away
  reached only the stream);
- ``FLEET_TOKENS`` again when a gap shows (``ChunkStore.read``).

Chunks carry ``(attempt, index)``. The stream keeps the current attempt and the next index it
expects: a chunk of another attempt, or one already delivered, is dropped; a chunk past the next
index means chunks were lost, and they are read back from ``FLEET_TOKENS`` first (when that
fails, the attempt is interrupted: "lost token chunks").

An ``Interrupted`` notice says the current attempt cannot go on (its worker left, it stalled,
chunks were lost); the reader migrates the request and calls ``begin_attempt``. Notices carry
the attempt they are about, so a late notice about an attempt already left behind is dropped.
The stall clock runs from the last delivered chunk or the last publish of the request, or from
the last step its worker's engine took, whichever is later: a request queued behind others on a
working engine (a long queue on a slow real engine) is waiting, not stalled; on an engine whose
step count stopped, it stalls.

No routing here: the generation that owns the stream (``router/generation.py``) migrates; the
client (``router/client.py``) only feeds it chunks, notices and the time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import structlog
from nats.js import JetStreamContext, api

from schemas import TokenChunk, WireDecodeError, decode
from schemas.subjects import Subjects

log = structlog.get_logger("jetfleet.router")


@dataclass(frozen=True, slots=True)
class Interrupted:
    """The current attempt cannot go on; ``attempt``: the one it is about."""

    reason: str
    attempt: int


class ChunkStore(Protocol):
    """Where a request's published chunks are kept (``FLEET_TOKENS``)."""

    async def read(self, request_id: str, attempt: int, indices: range) -> list[TokenChunk] | None:
        """The chunks ``indices`` of ``attempt``, in order; None when they cannot all be read."""
        ...

    async def last(self, request_id: str) -> TokenChunk | None:
        """The newest chunk kept for the request (any attempt), or None."""
        ...


class TokenStream:
    def __init__(self, request_id: str, store: ChunkStore, attempt: int = 0) -> None:
        self.request_id = request_id
        self.attempt = attempt  # the attempt whose chunks are delivered
        self.next_index = 0  # the index of that attempt's next chunk
        self.last_activity = time.monotonic()  # last chunk delivered or request published
        self.ended = False
        self._store = store
        self._inbox: asyncio.Queue[TokenChunk | Interrupted] = asyncio.Queue()
        self._ready: deque[TokenChunk] = deque()  # in order, a gap's chunks then the one after
        self._stalled_at = 0.0  # when the stall clock last ran out
        self._stall_waits = 0  # stalls in a row waited out with nowhere to go

    # ---- fed by the client
    def feed(self, chunk: TokenChunk) -> None:
        """A chunk from any source; ``next`` orders, de-duplicates and gap-fills."""
        self._inbox.put_nowait(chunk)

    def feed_wire(self, data: bytes) -> None:
        """A chunk as published (a subscription's message); an undecodable one is logged."""
        try:
            self.feed(decode(data, TokenChunk))
        except WireDecodeError as exc:
            log.warning("bad_token_chunk", request_id=self.request_id, error=str(exc))

    def interrupt(self, reason: str) -> None:
        """The current attempt cannot go on (its worker left, ...): the reader migrates."""
        if not self.ended:
            self._inbox.put_nowait(Interrupted(reason, self.attempt))

    def check_stall(
        self,
        now: float,
        timeout_s: float,
        worker_progress_at: float = 0.0,
        elsewhere: Callable[[], bool] | None = None,
        patience: int = 0,
    ) -> bool:
        """Interrupt an attempt that has delivered nothing for ``timeout_s`` while its worker
        made no progress either (the clock then starts again, so a slow migration is not
        interrupted twice). Returns whether it stalled.

        A stall with nowhere to go (``elsewhere()`` is false: no other live worker could take
        the request) is waited out up to ``patience`` more timeouts in a row, on the worker it
        is on: a migration would only end it in an error, while a worker that crawls (an
        engine beside another's cold start on a small host) still answers. Past that it is
        interrupted all the same, so a worker that stays registered and never answers ends
        its requests with an error. Any progress since the last stall starts the count
        again."""
        active = max(self.last_activity, worker_progress_at)
        if active > self._stalled_at:
            self._stall_waits = 0
        if self.ended or now - max(active, self._stalled_at) <= timeout_s:
            return False
        self._stalled_at = now
        if self._stall_waits < patience and elsewhere is not None and not elsewhere():
            self._stall_waits += 1
            log.warning(
                "request_stalled_nowhere_to_go",
                request_id=self.request_id,
                waited=self._stall_waits,
                patience=patience,
            )
            return True
        self._stall_waits = 0
        self.interrupt("stalled")
        return True

    async def catch_up(self, timeout_s: float = 1.0) -> None:
        """Feed the newest stored chunk when it is one this stream has not delivered: a request
        whose last chunk was published while this process was away ends now (the gap before it
        is filled as any gap is), not at its stall timeout."""
        try:
            chunk = await asyncio.wait_for(self._store.last(self.request_id), timeout_s)
        except Exception:  # the stream electing a leader, a timeout: the stall clock remains
            return
        if chunk is not None and chunk.attempt == self.attempt and chunk.index >= self.next_index:
            self.feed(chunk)

    # ---- driven by the reader
    @property
    def pending(self) -> bool:
        """Chunks or notices have arrived that ``next`` has not returned yet."""
        return bool(self._ready) or not self._inbox.empty()

    def begin_attempt(self, attempt: int) -> None:
        """The request was migrated: deliver ``attempt``'s chunks from index 0."""
        self.attempt = attempt
        self.next_index = 0
        self._ready.clear()

    def published(self) -> None:
        """The current attempt's request is out: its stall clock starts."""
        self.last_activity = time.monotonic()

    def end(self) -> None:
        """Finished or cancelled: no more notices."""
        self.ended = True

    async def next(self) -> TokenChunk | Interrupted:
        """The next chunk of the current attempt in order, or a notice about it."""
        while not self._ready:
            item = await self._inbox.get()
            if isinstance(item, Interrupted):
                if item.attempt == self.attempt:
                    return item
                continue  # about an attempt already migrated away from
            await self._accept(item)
        self.last_activity = time.monotonic()
        return self._ready.popleft()

    async def _accept(self, chunk: TokenChunk) -> None:
        if chunk.attempt != self.attempt or chunk.index < self.next_index:
            return  # stale attempt or duplicate
        if chunk.index > self.next_index:
            gap = range(self.next_index, chunk.index)
            missing = await self._store.read(self.request_id, self.attempt, gap)
            if missing is None:
                self.interrupt("lost token chunks")
                return
            self._ready.extend(missing)
        self._ready.append(chunk)
        self.next_index = chunk.index + 1


class StoredChunks:
    """``ChunkStore`` over ``FLEET_TOKENS``."""

    def __init__(self, js: JetStreamContext, subjects: Subjects, read_timeout_s: float = 1.0):
        self.js = js
        self.subjects = subjects
        self.read_timeout_s = read_timeout_s  # per chunk while filling a gap

    async def read(self, request_id: str, attempt: int, indices: range) -> list[TokenChunk] | None:
        want = set(indices)
        found: dict[int, TokenChunk] = {}
        sub = None
        try:  # any failure (the stream electing a leader, a timeout): None, and it migrates
            sub = await self.js.subscribe(
                self.subjects.tok(request_id),
                stream=self.subjects.stream_name("TOKENS"),
                ordered_consumer=True,
                deliver_policy=api.DeliverPolicy.ALL,
            )
            while want - found.keys():
                msg = await sub.next_msg(timeout=self.read_timeout_s)
                chunk = decode(msg.data, TokenChunk)
                if chunk.attempt == attempt and chunk.index in want:
                    found[chunk.index] = chunk
        except Exception as exc:
            log.warning("chunk_recovery_failed", request_id=request_id, error=str(exc))
            return None
        finally:
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
        return [found[i] for i in sorted(found)]

    async def last(self, request_id: str) -> TokenChunk | None:
        stream = self.subjects.stream_name("TOKENS")
        stored = await self.js.get_last_msg(stream, self.subjects.tok(request_id))
        return decode(stored.data or b"", TokenChunk)
