"""The KV event subscriber against a real ZMQ publisher speaking vLLM's protocol.

``VllmLikePublisher`` does what vLLM's ``ZmqEventPublisher`` does: ``[topic, seq (8 B big-endian),
msgpack batch]`` on a PUB socket, every batch kept in a bounded buffer, and a ROUTER answering
``[identity, b"", start]`` with ``[identity, b"", seq, payload]`` for each buffered batch from
``start`` on, then ``[identity, b"", -1, b""]`` (vLLM 0.26 and later put the topic before the
sequence number: ``[identity, b"", topic, seq, payload]``, end ``[identity, b"", b"", -1, b""]``;
the publisher fixture runs every test in both forms). The PUB is an XPUB (same wire) only so the
test can wait for the subscription instead of sleeping. Tests may drop a batch from the PUB side (it
stays in the buffer: replay fills it) or from the buffer too (the gap cannot be filled).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio

from schemas.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvCacheEvent
from tests.support.vllm_fakes import FakeBackend
from tests.support.vllm_wire_mirror import (
    AllBlocksClearedV3,
    BlockRemovedV3,
    KVEventBatchV2,
    KVEventBatchV3,
    encode,
    stored_v3,
)
from tests.support.wait import wait_for
from workers.engine import EngineHooks
from workers.engines.vllm.config import VllmEngineConfig
from workers.engines.vllm.engine import VllmEngine
from workers.engines.vllm.kv_events import BatchReader, DecodedBatch
from workers.engines.vllm.subscriber import KvEventSubscriber

TOPIC = "kv-events"
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class VllmLikePublisher:
    def __init__(
        self, ctx: zmq.asyncio.Context, buffer_steps: int = 100, *, replay_topic: bool = False
    ) -> None:
        self.replay_topic = replay_topic  # vLLM 0.26+: replies carry the topic
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind("tcp://127.0.0.1:*")
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind("tcp://127.0.0.1:*")
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.seq = 0
        self.replay_requests: list[int] = []
        self._task = asyncio.create_task(self._serve_replay())

    @property
    def endpoint(self) -> str:
        return self.pub.getsockopt_string(zmq.LAST_ENDPOINT)

    @property
    def replay_endpoint(self) -> str:
        return self.router.getsockopt_string(zmq.LAST_ENDPOINT)

    async def subscribed(self) -> None:
        msg = await asyncio.wait_for(self.pub.recv(), 5.0)
        assert msg == b"\x01" + TOPIC.encode()

    async def publish(self, payload: bytes, *, drop: bool = False, forget: bool = False) -> int:
        seq, self.seq = self.seq, self.seq + 1
        if not drop:
            await self.pub.send_multipart([TOPIC.encode(), seq.to_bytes(8, "big"), payload])
        if not forget:
            self.buffer.append((seq, payload))
        return seq

    def restart(self) -> None:
        self.seq = 0
        self.buffer.clear()

    async def _serve_replay(self) -> None:
        while True:
            frame = await self.router.recv_multipart()
            if len(frame) != 3:
                continue  # vLLM: "Invalid replay request", no answer
            client_id, _, start_bytes = frame
            start = int.from_bytes(start_bytes, "big")
            self.replay_requests.append(start)
            topic = [TOPIC.encode()] if self.replay_topic else []
            for seq, buf in list(self.buffer):
                if seq >= start:
                    reply = [client_id, b"", *topic, seq.to_bytes(8, "big"), buf]
                    await self.router.send_multipart(reply)
            end = [client_id, b"", b"", END_SEQ, b""] if self.replay_topic else None
            await self.router.send_multipart(end or [client_id, b"", END_SEQ, b""])

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.pub.close(linger=0)
        self.router.close(linger=0)


def batch(*events: Any, ts: float = 1.0) -> bytes:
    return encode(KVEventBatchV3(ts=ts, events=list(events)))


def stored(h: int, parent: int | None) -> Any:
    return stored_v3([h], parent, [h * 10, h * 10 + 1], 2)


class Recorder:
    """A subscriber's sink: decodes as the worker does (with a release's ``KVEventBatch``:
    vLLM 0.25's mirrored unless given), keeps what arrives."""

    def __init__(self, batch_type: type[Any] = KVEventBatchV3) -> None:
        self.reader = BatchReader(batch_type)
        self.events: list[KvCacheEvent] = []
        self.lost: list[str] = []

    def decode(self, payload: bytes) -> DecodedBatch:
        return self.reader.decode(payload)

    def on_events(self, events: Sequence[KvCacheEvent]) -> None:
        self.events.extend(events)

    def on_lost(self, reason: str) -> None:
        self.lost.append(reason)

    def stored_hashes(self) -> list[int]:
        return [h for e in self.events if isinstance(e, BlockStored) for h in e.block_hashes]


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    for sub in _open_subscribers:  # left open by a failed test
        await sub.close()
    _open_subscribers.clear()
    context.destroy(linger=0)


_open_subscribers: list[KvEventSubscriber] = []


@pytest.fixture(params=["before-0.26", "0.26+"])
async def publisher(
    ctx: zmq.asyncio.Context, request: pytest.FixtureRequest
) -> AsyncIterator[VllmLikePublisher]:
    pub = VllmLikePublisher(ctx, replay_topic=request.param == "0.26+")
    yield pub
    await pub.close()


def engine_config(pub: VllmLikePublisher, replay: bool = True, **kw: Any) -> VllmEngineConfig:
    """A vLLM engine whose KV events come from ``pub`` (block size 2, as the batches here)."""
    return VllmEngineConfig(
        model="m",
        block_size=2,
        kv_events_endpoint=pub.endpoint,
        kv_replay_endpoint=pub.replay_endpoint if replay else "",
        kv_events_topic=TOPIC,
        **kw,
    )


async def subscribe(
    ctx: zmq.asyncio.Context,
    pub: VllmLikePublisher,
    rec: Recorder,
    replay: str | None = "",
    timeout_s: float = 1.0,
) -> KvEventSubscriber:
    sub = KvEventSubscriber(
        pub.endpoint,
        pub.replay_endpoint if replay == "" else replay,
        TOPIC,
        rec,
        replay_timeout_s=timeout_s,
        ctx=ctx,
    )
    _open_subscribers.append(sub)
    await sub.start()
    await pub.subscribed()
    return sub


async def test_batches_arrive_in_order(
    ctx: zmq.asyncio.Context, publisher: VllmLikePublisher
) -> None:
    rec = Recorder()
    sub = await subscribe(ctx, publisher, rec)
    await publisher.publish(batch(stored(1, None), stored(2, 1)))
    await publisher.publish(encode(KVEventBatchV2(ts=2.0, events=[], data_parallel_rank=0)))
    await publisher.publish(batch(BlockRemovedV3([2], "GPU")))
    await wait_for(lambda: sub.stats.batches == 3, timeout=5.0, interval=0.005)
    assert rec.stored_hashes() == [1, 2]
    assert rec.events[-1] == BlockRemoved((2,))
    assert rec.lost == [] and publisher.replay_requests == []
    await sub.close()


async def test_a_dropped_batch_is_filled_from_the_replay_socket(
    ctx: zmq.asyncio.Context, publisher: VllmLikePublisher
) -> None:
    rec = Recorder()
    sub = await subscribe(ctx, publisher, rec)
    await publisher.publish(batch(stored(1, None)))
    await publisher.publish(batch(stored(2, 1)), drop=True)
    await publisher.publish(batch(stored(3, 2)), drop=True)
    await publisher.publish(batch(stored(4, 3)))
    await wait_for(lambda: sub.stats.batches == 4, timeout=5.0, interval=0.005)
    assert rec.stored_hashes() == [1, 2, 3, 4]
    assert publisher.replay_requests == [1]
    assert (sub.stats.gaps_filled, sub.stats.replayed, sub.stats.losses) == (1, 2, 0)
    assert rec.lost == []
    await sub.close()


async def test_an_unfillable_gap_becomes_cleared_and_lost(
    ctx: zmq.asyncio.Context, publisher: VllmLikePublisher
) -> None:
    rec = Recorder()
    sub = await subscribe(ctx, publisher, rec)
    await publisher.publish(batch(stored(1, None)))
    await publisher.publish(batch(stored(2, 1)), drop=True, forget=True)  # out of the buffer
    await publisher.publish(batch(stored(3, None)))
    await publisher.publish(batch(stored(4, 3)))
    await wait_for(lambda: rec.stored_hashes() == [1, 3, 4], timeout=5.0, interval=0.005)
    assert rec.events[1] == AllBlocksCleared()  # before what came after the gap
    assert len(rec.lost) == 1 and "1..1" in rec.lost[0]
    assert publisher.replay_requests == [1]
    await sub.close()


async def test_no_replay_answer_counts_as_lost(
    ctx: zmq.asyncio.Context, publisher: VllmLikePublisher
) -> None:
    silent = ctx.socket(zmq.ROUTER)  # accepts the request, never answers
    silent.bind("tcp://127.0.0.1:*")
    rec = Recorder()
    sub = await subscribe(
        ctx, publisher, rec, replay=silent.getsockopt_string(zmq.LAST_ENDPOINT), timeout_s=0.2
    )
    await publisher.publish(batch(stored(1, None)))
    await publisher.publish(batch(stored(2, 1)), drop=True)
    await publisher.publish(batch(stored(3, None)))
    await wait_for(lambda: rec.stored_hashes() == [1, 3], timeout=5.0, interval=0.005)
    assert rec.lost and AllBlocksCleared() in rec.events
    await sub.close()
    silent.close(linger=0)


async def test_without_a_replay_endpoint_a_gap_is_lost_at_once(
    ctx: zmq.asyncio.Context, publisher: VllmLikePublisher
) -> None:
    rec = Recorder()
    sub = await subscribe(ctx, publisher, rec, replay=None)
    await publisher.publish(batch(stored(1, None)))
    await publisher.publish(batch(stored(2, 1)), drop=True)
    await publisher.publish(batch(stored(3, None)))
    await wait_for(lambda: rec.stored_hashes() == [1, 3], timeout=5.0, interval=0.005)
    assert len(rec.lost) == 1 and publisher.replay_requests == []
    await sub.close()


async def test_a_restarted_publisher_clears(
    ctx: zmq.asyncio.Context, publisher: VllmLikePublisher
) -> None:
    rec = Recorder()
    sub = await subscribe(ctx, publisher, rec)
    await publisher.publish(batch(stored(1, None)))
    await publisher.publish(batch(stored(2, 1)))
    await wait_for(lambda: sub.stats.batches == 2, timeout=5.0, interval=0.005)
    publisher.restart()
    await publisher.publish(batch(stored(7, None)))
    await wait_for(lambda: rec.stored_hashes() == [1, 2, 7], timeout=5.0, interval=0.005)
    assert rec.events[2] == AllBlocksCleared()
    assert rec.lost == ["publisher restarted"]
    await sub.close()


async def test_an_undecodable_batch_is_lost_and_the_stream_goes_on(
    ctx: zmq.asyncio.Context, publisher: VllmLikePublisher
) -> None:
    rec = Recorder()
    sub = await subscribe(ctx, publisher, rec)
    await publisher.publish(msgspec.msgpack.encode({"no": "events"}))
    await publisher.publish(batch(stored(1, None)))
    await wait_for(lambda: rec.stored_hashes() == [1], timeout=5.0, interval=0.005)
    assert rec.events[0] == AllBlocksCleared() and len(rec.lost) == 1
    await sub.close()


# --------------------------------------------------------------- engine + subscriber + shadow
async def test_engine_forwards_events_resyncs_and_resets_after_a_loss(
    ctx: zmq.asyncio.Context, publisher: VllmLikePublisher
) -> None:
    backend = FakeBackend()
    backend.llm.reset_results = [False, True]  # blocks in use once, then the reset succeeds
    cfg = engine_config(publisher, kv_reset_retry_s=0.01)
    calls: list[list[KvCacheEvent]] = []
    engine = VllmEngine(cfg, backend)
    await engine.start(EngineHooks(lambda events: calls.append(list(events))))
    await publisher.subscribed()
    await publisher.publish(batch(stored(1, None), stored(2, 1)))
    await publisher.publish(batch(stored(3, 2), stored(9, 8)))  # 9: parent never seen, dropped
    await wait_for(lambda: len(calls) == 2, timeout=5.0, interval=0.005)
    assert [[e.block_hashes for e in c] for c in calls] == [[(1,), (2,)], [(3,)]]  # type: ignore[union-attr]

    calls.clear()
    res = await engine.control("kv_resync", {})
    assert res.ok
    resent = [e for c in calls for e in c]
    assert resent[0] == AllBlocksCleared()
    assert [h for e in resent[1:] for h in e.block_hashes] == [1, 2, 3]  # type: ignore[union-attr]

    calls.clear()
    await publisher.publish(batch(stored(4, 3)), drop=True, forget=True)
    await publisher.publish(batch(stored(5, 4)))  # after the loss: an orphan, not forwarded
    await wait_for(lambda: len(backend.llm.reset_results) == 0, timeout=5.0, interval=0.005)
    await publisher.publish(batch(stored(6, None)))
    # The loss clears the fleet's view; so does the confirmed reset (vLLM's own AllBlocksCleared
    # would only come with its next engine step).
    after_loss = [AllBlocksCleared(), AllBlocksCleared(), BlockStored((6,), None, (60, 61), 2)]
    await wait_for(lambda: [e for c in calls for e in c] == after_loss, timeout=5.0, interval=0.005)
    health = await engine.control("health", {})
    assert health.data["kv_events"] == {"batches": 4, "gaps_filled": 0, "losses": 1, "orphans": 2}
    await engine.stop()


async def test_a_resync_goes_out_as_one_batch_per_chunk(
    ctx: zmq.asyncio.Context, publisher: VllmLikePublisher
) -> None:
    """The worker runtime coalesces listener calls made in one loop iteration into one batch
    (``call_soon``); the resync yields between chunks so each chunk is its own batch."""
    cfg = engine_config(publisher, replay=False, kv_resync_chunk_tokens=4)
    engine = VllmEngine(cfg, FakeBackend())
    batches: list[list[KvCacheEvent]] = []
    pending: list[KvCacheEvent] = []
    loop = asyncio.get_running_loop()

    def flush() -> None:
        if pending:
            batches.append(pending.copy())
            pending.clear()

    def listener(events: Sequence[KvCacheEvent]) -> None:  # as WorkerRuntime._on_kv_events
        if not pending:
            loop.call_soon(flush)
        pending.extend(events)

    await engine.start(EngineHooks(listener))
    await publisher.subscribed()
    await publisher.publish(batch(stored_v3(list(range(1, 7)), None, list(range(12)), 2)))
    await wait_for(lambda: batches, timeout=5.0, interval=0.005)
    batches.clear()
    assert (await engine.control("kv_resync", {})).ok
    await wait_for(lambda: not pending, timeout=5.0, interval=0.005)
    stored_per_batch = [[e.block_hashes for e in b if isinstance(e, BlockStored)] for b in batches]
    assert stored_per_batch == [[(1, 2)], [(3, 4)], [(5, 6)]]
    assert batches[0][0] == AllBlocksCleared()
    await engine.stop()


async def test_before_0_12_a_reset_after_a_loss_counts_only_once_vllm_publishes_its_clear(
    ctx: zmq.asyncio.Context, publisher: VllmLikePublisher
) -> None:
    """vLLM < 0.12 returns None from ``reset_prefix_cache`` whether or not it reset: the engine
    keeps asking until vLLM's own ``AllBlocksCleared`` comes through the event stream."""
    backend = FakeBackend(version="0.11.2")
    backend.llm.reset_results = [None] * 1000
    cfg = engine_config(publisher, kv_reset_retry_s=0.01)
    engine = VllmEngine(cfg, backend)
    await engine.start(EngineHooks(lambda events: None))
    await publisher.subscribed()
    await publisher.publish(batch(stored(1, None)))
    await publisher.publish(batch(stored(2, 1)), drop=True, forget=True)  # lost for good
    await publisher.publish(batch(stored(3, None)))
    await wait_for(lambda: backend.llm.resets >= 3, timeout=5.0, interval=0.005)
    assert engine.kv.resetting  # still unconfirmed
    await publisher.publish(batch(AllBlocksClearedV3()))  # vLLM's next step publishes it
    await wait_for(lambda: not engine.kv.resetting, timeout=5.0, interval=0.005)
    await engine.stop()
