"""An asyncio client of vLLM's KV event publisher (``ZmqEventPublisher``): SUB + replay.

One task reads ``[topic, seq, payload]`` messages from the SUB socket (wire format:
``kv_events``), checks the sequence number and hands the decoded events to ``on_events``, in
order. On a gap (``expected .. seq-1`` missing: a PUB high-water mark overflow, or messages sent
before the subscription took hold) it asks the replay ROUTER for them from a DEALER socket::

    -> [b"", expected as 8 B big-endian]
    <- [b"", seq, payload] for every buffered batch from ``expected`` on, then [b"", -1, b""]

and applies the missing batches before the one that revealed the gap. When replay cannot fill the
gap (no replay endpoint, no answer within ``replay_timeout_s``, batches already out of vLLM's
buffer) or a payload cannot be decoded, the events are lost: the subscriber passes
``AllBlocksCleared`` to ``on_events`` (the fleet forgets this worker's blocks) and calls
``on_lost(reason)`` so the engine can bring vLLM's cache back in line (``engine.py``). The same
happens when the publisher restarts (sequence 0 again).

Callbacks run on the event loop, between awaits of this task; they must not block.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog
import zmq
import zmq.asyncio

from base.cancelling import cancel_and_wait
from schemas.kv_events import AllBlocksCleared, KvCacheEvent
from workers.engines.vllm.kv_events import (
    DecodedBatch,
    SeqKind,
    SequenceTracker,
    VllmKvDecodeError,
    fill_gap,
    parse_pub_frames,
    parse_replay_frames,
    replay_request,
)

log = structlog.get_logger("jetfleet.vllm.kv")


class KvSink(Protocol):
    """Where the subscriber's batches go (``KvFollower``)."""

    def decode(self, payload: bytes) -> DecodedBatch:
        """A batch's payload, decoded (raises ``VllmKvDecodeError``)."""
        ...

    def on_events(self, events: Sequence[KvCacheEvent]) -> None:
        """A batch's events, in order (an ``AllBlocksCleared`` when events were lost)."""
        ...

    def on_lost(self, reason: str) -> None:
        """Events were lost for good (after the ``AllBlocksCleared``)."""
        ...


@dataclass
class SubscriberStats:
    batches: int = 0  # batches applied (received or replayed)
    replayed: int = 0  # of which obtained from the replay socket
    gaps_filled: int = 0
    losses: int = 0  # times events were given up on (cleared + on_lost)
    duplicates: int = 0
    skipped_events: int = 0  # other media / groups / unknown types or adapters


class KvEventSubscriber:
    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None,
        topic: str,
        sink: KvSink,
        *,
        replay_timeout_s: float = 1.0,
        ctx: zmq.asyncio.Context | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self.stats = SubscriberStats()
        self._sink = sink
        self._replay_timeout_s = replay_timeout_s
        self._ctx = ctx or zmq.asyncio.Context.instance()
        self._tracker = SequenceTracker()
        self._sub: zmq.asyncio.Socket | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Connect (ZMQ connects before the publisher binds and retries) and start reading."""
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        sub.connect(self.endpoint)
        self._sub = sub
        self._task = asyncio.create_task(self._run(), name="vllm-kv-subscriber")

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None
        for sock in (self._sub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._sub = self._replay = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _run(self) -> None:
        assert self._sub is not None
        while True:
            frames = await self._sub.recv_multipart()
            try:
                seq, payload = parse_pub_frames(frames)
            except VllmKvDecodeError as exc:  # not a batch at all: the sequence check catches loss
                log.warning("vllm_kv_bad_frame", error=str(exc), endpoint=self.endpoint)
                continue
            try:
                await self._receive(seq, payload)
            except Exception:  # a failing callback must not end the subscription
                log.exception("vllm_kv_apply_failed", seq=seq)

    async def _receive(self, seq: int, payload: bytes) -> None:
        verdict = self._tracker.check(seq)
        if verdict.kind is SeqKind.DUPLICATE:
            self.stats.duplicates += 1
            return
        if verdict.kind is SeqKind.RESTART:
            self._lose("publisher restarted")
        elif verdict.kind is SeqKind.GAP:
            await self._fill(verdict.missing_from, seq)
        self._apply(seq, payload)

    def _apply(self, seq: int, payload: bytes) -> None:
        self._tracker.applied(seq)
        try:
            batch = self._sink.decode(payload)
        except VllmKvDecodeError as exc:
            log.warning("vllm_kv_undecodable", seq=seq, error=str(exc))
            self._lose(f"batch {seq} undecodable: {exc}")
            return
        self.stats.batches += 1
        self.stats.skipped_events += batch.skipped
        if batch.events:
            self._sink.on_events(batch.events)

    async def _fill(self, start: int, stop: int) -> None:
        """Apply batches ``start .. stop-1`` from the replay socket, or give them up."""
        replies = await self._ask_replay(start)
        filled = None if replies is None else fill_gap(replies, start, stop)
        if filled is None:
            log.warning("vllm_kv_gap_lost", first=start, last=stop - 1)
            self._lose(f"batches {start}..{stop - 1} lost")
            self._tracker.applied(stop - 1)
            return
        for seq, payload in filled:
            self._apply(seq, payload)
        self.stats.replayed += len(filled)
        self.stats.gaps_filled += 1
        log.info("vllm_kv_gap_filled", first=start, last=stop - 1)

    async def _ask_replay(self, start: int) -> list[tuple[int, bytes]] | None:
        if not self.replay_endpoint:
            return None
        if self._replay is None:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.replay_endpoint)
            self._replay = sock
        sock = self._replay
        replies: list[tuple[int, bytes]] = []
        try:
            async with asyncio.timeout(self._replay_timeout_s):
                await sock.send_multipart(replay_request(start))
                while (reply := parse_replay_frames(await sock.recv_multipart())) is not None:
                    replies.append(reply)
        except (TimeoutError, VllmKvDecodeError) as exc:
            # Late replies would be read as the answer to the next request: start afresh.
            log.warning("vllm_kv_replay_failed", start=start, error=repr(exc))
            sock.close(linger=0)
            self._replay = None
            return None
        return replies

    def _lose(self, reason: str) -> None:
        self.stats.losses += 1
        self._sink.on_events([AllBlocksCleared()])
        self._sink.on_lost(reason)
