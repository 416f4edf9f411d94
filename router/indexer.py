"""The KV indexer service: FLEET_KV -> the Redis prefix index.

- **Position in Redis, not in the consumer.** Every applied batch writes its stream sequence in the
  same Lua call as the change, so on start the indexer reads ``applied_seq`` and reads the stream
  from the next sequence with an ordered consumer (the fastest consumer nats-py has; no acks).
  A restart resumes exactly; a batch applied twice changes nothing.
- **Pipelined.** Messages that have arrived are taken in groups (up to ``batch_max``). A group is
  written as soon as it is translated, as script calls carrying many batches each
  (``redis_index.MAX_BLOCKS_PER_CALL`` block events), and its results are read only after the
  next group was translated and written: Redis applies one group while Python translates the
  next, without a gap between them (calls on one connection run in the order written).
- **Decoded lazily.** Batches are decoded as ``WireKvBatch`` (token ids left encoded): engines
  hashing like the fleet (the mocker) are only spot-checked, so their token ids are never
  turned into Python ints; opaque engine hashes (vLLM) are recomputed from them (``translate``).
- **One writer at a time.** Several indexers may run for availability: they compete for a Redis
  lock (``SET NX PX``, renewed every ``leader_ttl/3``); the standby takes over within the TTL and
  resumes from the stored position, so a worker's events are never applied out of order.
- **Gaps heal.** A batch whose event id skips, whose parent block is unknown, or whose token ids
  cannot be read makes the indexer drop that worker's entries and ask the worker (control op
  ``kv_resync``) to publish its whole cache again as ``AllBlocksCleared`` + ``BlockStored``.
- **Snapshots.** Every ``snapshot_every_s`` the leader writes the whole index (each worker's
  engine -> fleet mapping and event id, with the applied sequence) to the object store; an indexer
  that starts on an empty Redis restores it and replays only what came after, so FLEET_KV's
  retention needs to cover just the time since the last snapshot. (A snapshot has no block
  parents, so restored workers are matched block by block until they clear their cache.)
- **Departures.** A worker that leaves discovery has all its blocks dropped, and batches of it
  still in the stream are skipped (until it registers again).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import ObjectNotFoundError
from prometheus_client import CollectorRegistry, Counter, Gauge

from base.connect import close_nats, connect_nats, connect_redis
from base.consume import DeadLetters
from base.ops_http import nats_connected, start_ops_server
from base.signals import stop_event
from base.topology import ensure_topology
from base.worker_watch import WorkerWatch
from router.kv.keys import LEADER_TTL_MS, KvKeys
from router.kv.redis_index import AppliedLater, ApplyItem, RedisPrefixIndex
from router.kv.resp import REDIS_UNREACHABLE
from router.kv.translate import (
    EventTranslator,
    IndexOp,
    WireBlockStored,
    WireKvBatch,
    holders,
    worker_of,
)
from schemas import ControlRequest, ModelCard, Subjects, decode, encode
from schemas.kv_events import BlockRemoved, IndexSnapshot
from schemas.streams import KV_SNAPSHOT_STORE, MODELS_BUCKET

_BACKOFF_FIRST_S = 0.25  # Redis unreachable: first wait before leading again
_BACKOFF_MAX_S = 5.0

log = structlog.get_logger("jetfleet.indexer")

SNAPSHOT_OBJECT = "latest"

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


@dataclass(frozen=True)
class IndexerConfig:
    nats_url: str
    redis_url: str
    subjects: Subjects = field(default_factory=Subjects)
    batch_max: int = 1024  # messages applied in one pipelined round trip
    leader_ttl_ms: int = LEADER_TTL_MS
    metrics_port: int = 0  # the operations port: /metrics, /health (0: off)
    metrics_host: str = "127.0.0.1"
    snapshot_every_s: float = 60.0  # snapshot the index to the object store this often (0: off)
    reconcile_every_s: float = 30.0
    """Drop indexed workers discovery does not know this often, once caught up (0: off)."""
    indexer_id: str = field(default_factory=lambda: f"ix-{uuid.uuid4().hex[:8]}")


@dataclass
class _Prepared:
    items: list[ApplyItem] = field(default_factory=list)
    batches: list[WireKvBatch | None] = field(default_factory=list)  # None: nothing to count
    heals: list[tuple[str, str, str, int]] = field(default_factory=list)


def _stream_seq(msg: Msg) -> int:
    """A JetStream message's stream sequence, read from its reply subject
    ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ts>.<pending>``
    (``msg.metadata`` also builds a datetime and two dataclasses per message); nats-py parses
    any other form (with domain and account)."""
    tokens = msg.reply.split(".")
    if len(tokens) == 9 and tokens[0] == "$JS" and tokens[1] == "ACK":
        return int(tokens[5])
    return int(msg.metadata.sequence.stream)


def _count(batch: WireKvBatch, counts: dict[str, int]) -> None:
    counts["batches"] += 1
    for ev in batch.events:
        if isinstance(ev, WireBlockStored):
            counts["stored"] += len(ev.block_hashes)
        elif isinstance(ev, BlockRemoved):
            counts["removed"] += len(ev.block_hashes)
        else:
            counts["cleared"] += 1


class IndexerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        ns = "jetfleet_indexer"
        self.registry = registry
        self.blocks = Counter(
            f"{ns}_block_events", "Block events applied", ["kind"], registry=registry
        )
        self.batches = Counter(f"{ns}_batches", "KV event batches applied", registry=registry)
        self.gaps = Counter(f"{ns}_gaps", "Event id gaps healed", registry=registry)
        self.dead = Counter(f"{ns}_dead_letters", "Undecodable batches", registry=registry)
        self.lag = Gauge(f"{ns}_lag_messages", "Stream messages not yet applied", registry=registry)
        self.applied_seq = Gauge(
            f"{ns}_applied_seq", "Last stream sequence applied", registry=registry
        )
        self.leader = Gauge(
            f"{ns}_leader", "1 while this indexer holds the lock", registry=registry
        )


class Indexer:
    def __init__(
        self,
        cfg: IndexerConfig,
        nc: NATS,
        redis: Any,
        metrics: IndexerMetrics,
        live_workers: Callable[[], set[str] | None] = lambda: None,
    ) -> None:
        """``live_workers``: the workers discovery knows, or None until its first full read
        (``run_indexer`` passes its ``WorkerWatch``'s; without it there is nothing to reconcile
        against)."""
        self.cfg = cfg
        self.nc = nc
        self.js = nc.jetstream()
        self.letters = DeadLetters(nc, cfg.subjects, "indexer")
        self.redis = redis
        self.keys = KvKeys.for_prefix(cfg.subjects.prefix)
        self.index = RedisPrefixIndex(redis, self.keys)
        self.translator = EventTranslator()
        self.metrics = metrics
        self.worker_models: dict[str, str] = {}
        self.departed: set[str] = set()  # left discovery: their late events are ignored
        self.live_workers = live_workers
        self._renew = redis.register_script(_RENEW)
        self.applied = 0
        self._snapshot_at = time.monotonic()
        self._snapshot_seq = 0
        self._resuming = False  # Redis was lost while this indexer may have led
        self.log = log.bind(indexer_id=cfg.indexer_id)

    # ------------------------------------------------------------------ leadership
    async def acquire(self) -> bool:
        """Take the lock, or, after losing Redis while leading, keep it: the promoted replica
        may hold this indexer's lock (replicated), which is still its own to renew."""
        resuming, self._resuming = self._resuming, False
        if await self.redis.set(
            self.keys.leader, self.cfg.indexer_id, nx=True, px=self.cfg.leader_ttl_ms
        ):
            return True
        return resuming and bool(
            await self._renew(
                keys=[self.keys.leader], args=[self.cfg.indexer_id, self.cfg.leader_ttl_ms]
            )
        )

    async def _keep_leadership(self, lost: asyncio.Event) -> None:
        while True:
            await asyncio.sleep(self.cfg.leader_ttl_ms / 3000)
            try:
                ok = await self._renew(
                    keys=[self.keys.leader], args=[self.cfg.indexer_id, self.cfg.leader_ttl_ms]
                )
            except Exception as exc:
                self.log.warning("leader_renew_failed", error=str(exc))
                ok = 0
            if not ok:
                lost.set()
                return

    async def release_leadership(self) -> None:
        with contextlib.suppress(Exception):
            if await self.redis.get(self.keys.leader) == self.cfg.indexer_id.encode():
                await self.redis.delete(self.keys.leader)

    # ------------------------------------------------------------------ main loop
    async def run(self, stop: asyncio.Event) -> None:
        """Lead (or stand by) until ``stop`` is set or this coroutine's task is cancelled.

        The work runs in a child task awaited through ``asyncio.shield``, so a cancellation of
        ``run`` is always delivered here, and the child is stopped twice over: cancelled, and by
        ``halt``, which its loops check. A cancellation can be swallowed inside the child:
        Python 3.11's ``asyncio.wait_for``, which redis-py wraps around every send, returns the
        result instead of raising when the cancel lands just as the send completes. Relying on
        the cancel alone left a killed indexer consuming (and ``await task`` hanging).
        ``run`` returns once the child has stopped and released the leadership.
        """
        halt = asyncio.Event()
        work = asyncio.create_task(self._run(stop, halt))
        try:
            await asyncio.shield(work)
        finally:
            if not work.done():  # run() was cancelled
                halt.set()
                work.cancel()
                await asyncio.wait({work})

    async def _run(self, stop: asyncio.Event, halt: asyncio.Event) -> None:
        backoff = _BACKOFF_FIRST_S
        while not (stop.is_set() or halt.is_set()):
            try:
                await self._lead_once(stop, halt)
                backoff = _BACKOFF_FIRST_S
            except REDIS_UNREACHABLE as exc:
                # an outage or a Sentinel failover: wait, then resume from the position stored
                # with the index (a failover's replica holds both, consistent with each other)
                self.log.warning("indexer_redis_unavailable", error=str(exc), retry_s=backoff)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(_first(stop, halt), backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX_S)

    async def _lead_once(self, stop: asyncio.Event, halt: asyncio.Event) -> None:
        """Wait for the lock, or lead until stopped or the lock is lost."""
        if not await self.acquire():
            self.metrics.leader.set(0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_first(stop, halt), self.cfg.leader_ttl_ms / 2000)
            return
        self.metrics.leader.set(1)
        self.log.info("indexer_leading")
        lost = asyncio.Event()
        keeper = asyncio.create_task(self._keep_leadership(lost))
        try:
            await self._consume(stop, lost, halt)
        except REDIS_UNREACHABLE:
            # Redis went away while this indexer led: the promoted replica may still hold its
            # lock (to renew, not to wait out), and may be behind what it applied, so its
            # in-memory translation state is dropped and rebuilt from Redis, as on a restart
            self._resuming = True
            self.translator = EventTranslator()
            self.worker_models.clear()
            raise
        finally:
            keeper.cancel()
            self.metrics.leader.set(0)
            await self.release_leadership()

    async def restore_snapshot(self) -> int:
        """Load the latest snapshot into an empty index; returns its sequence (0: none used)."""
        if await self.index.applied_seq() > 0:
            return 0
        store = await self.js.object_store(self.cfg.subjects.bucket_name(KV_SNAPSHOT_STORE))
        try:
            obj = await store.get(SNAPSHOT_OBJECT)
        except ObjectNotFoundError:
            return 0
        snap = decode(obj.data or b"", IndexSnapshot)
        await self.index.import_snapshot(snap)
        self.log.info("indexer_restored_snapshot", seq=snap.seq, workers=len(snap.workers))
        return snap.seq

    async def snapshot(self) -> int:
        """Write the index to the object store (call between commits); returns its sequence."""
        snap = await self.index.export_snapshot()
        store = await self.js.object_store(self.cfg.subjects.bucket_name(KV_SNAPSHOT_STORE))
        await store.put(SNAPSHOT_OBJECT, encode(snap))
        self._snapshot_at = time.monotonic()
        self._snapshot_seq = snap.seq
        self.log.info("indexer_snapshot_written", seq=snap.seq, workers=len(snap.workers))
        return snap.seq

    def _snapshot_due(self) -> bool:
        every = self.cfg.snapshot_every_s
        return bool(
            every
            and self.applied > self._snapshot_seq
            and time.monotonic() - self._snapshot_at >= every
        )

    async def _snapshot_now(self) -> None:
        try:
            if not await self.redis.exists(self.keys.epoch):  # Redis lost the index: not this
                self._snapshot_at = time.monotonic()
                return
            await self.snapshot()
        except Exception as exc:  # the next interval retries; replay just gets longer
            self._snapshot_at = time.monotonic()
            self.log.warning("indexer_snapshot_failed", error=str(exc))

    async def check_epoch(self) -> bool:
        """Whether the index in Redis can be trusted; a partial one is wiped first.

        A FLUSHALL, or a failover to an empty replica, empties Redis under a running fleet: the
        next apply writes its stream position into the empty Redis, and an indexer that resumed
        from that position would keep a partial index for good (and snapshot it). The epoch key
        is written with the first position and vanishes with the rest: a position without an
        epoch is such a partial index. It is wiped (routing reservations are left alone), so the
        snapshot restore and the replay rebuild it. Returns False when it had to wipe."""
        if await self.redis.exists(self.keys.epoch):
            return True
        intact = await self.index.applied_seq() == 0
        if not intact:
            doomed = [
                key
                async for key in self.redis.scan_iter(match=f"{self.keys.base}:*", count=1000)
                if not self.keys.is_reservation(key.decode())
            ]
            wiped = 0
            for i in range(0, len(doomed), 500):  # one round trip per 500 keys
                wiped += await self.redis.delete(*doomed[i : i + 500])
            self.translator = EventTranslator()
            self.worker_models.clear()
            self.log.warning("indexer_rebuilding_lost_index", wiped_keys=wiped)
        await self.redis.set(self.keys.epoch, self.cfg.indexer_id)
        return intact

    async def _consume(self, *stops: asyncio.Event) -> None:
        """Apply the stream from the stored position until one of ``stops`` is set."""
        await self.check_epoch()
        await self.restore_snapshot()
        start = await self.index.applied_seq() + 1
        self.applied = start - 1
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def on_msg(msg: Msg) -> None:
            queue.put_nowait(msg)

        sub = await self.js.subscribe(
            self.cfg.subjects.kv_all(),
            cb=on_msg,
            ordered_consumer=True,
            config=api.ConsumerConfig(
                deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start
            ),
        )
        self.log.info("indexer_consuming", from_seq=start)
        lag_task = asyncio.create_task(self._lag_loop())
        reconciler = asyncio.create_task(self._reconcile_loop(await self._tail_seq()))
        stopper = asyncio.create_task(_first(*stops))
        flight: tuple[_Prepared, AppliedLater] | None = None
        getter: asyncio.Future[Any] | None = None
        try:
            while not stopper.done():
                if flight is not None and queue.empty():  # nothing to overlap it with
                    await self._finish(*flight)
                    flight = None
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    break
                msgs = [getter.result()]
                while len(msgs) < self.cfg.batch_max and not queue.empty():
                    msgs.append(queue.get_nowait())
                prepared = await self._prepare(msgs)  # while Redis applies the previous group
                started = await self.index.start_apply(prepared.items)
                if flight is not None:
                    await self._finish(*flight)
                flight = (prepared, started)
                if self._snapshot_due():  # a snapshot needs nothing in flight
                    await self._finish(*flight)
                    flight = None
                    await self._snapshot_now()
            if flight is not None:
                await self._finish(*flight)
        finally:
            if getter is not None:
                getter.cancel()
            stopper.cancel()
            lag_task.cancel()
            reconciler.cancel()
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def apply_messages(self, msgs: list[Any]) -> None:
        """Translate and apply a group of messages (serially; ``_consume`` overlaps the two)."""
        prepared = await self._prepare(msgs)
        await self._finish(prepared, await self.index.start_apply(prepared.items))

    async def _prepare(self, msgs: list[Any]) -> _Prepared:
        """Decode and translate (CPU only: no Redis writes, so it can overlap a commit)."""
        prep = _Prepared()
        for msg in msgs:
            seq = _stream_seq(msg)
            # undecodable: dead-lettered (not terminated: the indexer moves on by stream position)
            # and applied as an empty item, as is a late batch of a worker already dropped
            batch = await self.letters.decoded(msg, WireKvBatch, terminate=False)
            if batch is None:
                self.metrics.dead.inc()
            if batch is None or batch.worker_id in self.departed:
                prep.items.append(("", "", 0, seq, ()))
                prep.batches.append(None)
                continue
            ops, problem = await self._translate(batch)
            prep.items.append((batch.model, batch.worker_id, batch.event_id, seq, ops))
            prep.batches.append(None if problem else batch)
            if problem:
                prep.heals.append((batch.model, batch.worker_id, problem, seq))
        return prep

    async def _finish(self, prep: _Prepared, started: AppliedLater) -> None:
        """Read a group's results (in group order): heal, count, move ``applied``."""
        results = await started.results()
        for model, worker_id, reason, seq in prep.heals:
            await self._heal(model, worker_id, reason, seq)
        counts = dict.fromkeys(("batches", "stored", "removed", "cleared"), 0)
        for item, batch, res in zip(prep.items, prep.batches, results, strict=True):
            if batch is not None and res.applied:
                _count(batch, counts)
                if res.gap:
                    await self._heal(batch.model, batch.worker_id, "event id gap", 0)
            self.applied = max(self.applied, item[3])
        self.metrics.batches.inc(counts.pop("batches"))
        for kind, n in counts.items():
            if n:
                self.metrics.blocks.labels(kind).inc(n)
        self.metrics.applied_seq.set(self.applied)

    async def _translate(self, batch: WireKvBatch) -> tuple[list[IndexOp], str]:
        """The batch's ops, or no ops and why the worker must be healed instead."""
        wid = batch.worker_id
        self.worker_models[wid] = batch.model
        if not self.translator.knows(wid):  # cold cache (start, failover): refill from Redis
            for hid in holders(wid):  # the worker and its lower tiers
                blocks = await self.index.worker_blocks(batch.model, hid)
                self.translator.preload(hid, blocks.mapping, blocks.parents)
        tr = self.translator.translate(batch)
        if tr.missing_parent:
            return [], "unknown parent block"
        if tr.unreadable_tokens:
            return [], "unreadable token ids"
        return tr.ops, ""

    async def _heal(self, model: str, worker_id: str, reason: str, seq: int) -> None:
        self.metrics.gaps.inc()
        self.log.warning("indexer_healing_worker", worker_id=worker_id, model=model, reason=reason)
        for hid in holders(worker_id):
            await self.index.drop_worker(model, hid, seq)
        self.translator.forget(worker_id)
        for hid in holders(worker_id):
            self.translator.preload(hid, {})
        with contextlib.suppress(Exception):
            await self.nc.publish(
                self.cfg.subjects.ctl(worker_id, "kv_resync"), encode(ControlRequest())
            )

    def worker_joined(self, worker_id: str) -> None:
        self.departed.discard(worker_id)

    async def worker_gone(self, worker_id: str) -> None:
        self.departed.add(worker_id)
        model = self.worker_models.pop(worker_id, None)
        self.translator.forget(worker_id)
        if model is None:
            return
        try:
            for hid in holders(worker_id):
                await self.index.drop_worker(model, hid)
        except REDIS_UNREACHABLE as exc:  # the periodic reconcile drops it once Redis answers
            self.log.warning("indexer_drop_failed", worker_id=worker_id, error=repr(exc))
            return
        self.log.info("indexer_dropped_worker", worker_id=worker_id, model=model)

    async def reconcile(self, live: set[str]) -> list[str]:
        """Drop every indexed worker discovery does not know: workers that left while no indexer
        ran never had their departure seen, and a replay or a snapshot brings their blocks back.
        Returns the dropped worker ids."""
        dropped: list[str] = []
        for model in sorted(await self._models()):
            indexed = {worker_of(h) for h in await self.index.workers(model)}
            for worker_id in sorted(indexed - live):
                self.worker_models.setdefault(worker_id, model)
                await self.worker_gone(worker_id)
                dropped.append(worker_id)
        if dropped:
            self.log.info("indexer_reconciled", dropped=dropped)
        return dropped

    async def _models(self) -> set[str]:
        """The models with indexed workers: those seen in the stream and those registered."""
        models = set(self.worker_models.values())
        with contextlib.suppress(Exception):  # no bucket or no keys yet
            kv = await self.js.key_value(self.cfg.subjects.bucket_name(MODELS_BUCKET))
            for key in await kv.keys():
                entry = await kv.get(key)
                if entry.value:
                    models.add(decode(entry.value, ModelCard).name)
        return models

    async def _tail_seq(self) -> int:
        with contextlib.suppress(Exception):
            info = await self.js.stream_info(self.cfg.subjects.stream_name("KV"))
            return int(info.state.last_seq)
        return 0

    async def _reconcile_loop(self, tail: int) -> None:
        """Once caught up with the stream (``tail``: its end when consuming began) and discovery
        has been read in full, reconcile; then every ``reconcile_every_s``."""
        every = self.cfg.reconcile_every_s
        if every <= 0:
            return
        while True:
            live = self.live_workers()
            if live is not None and self.applied >= tail:
                try:
                    await self.reconcile(live)
                except Exception as exc:  # Redis away: the next round retries
                    self.log.warning("indexer_reconcile_failed", error=repr(exc))
                await asyncio.sleep(every)
            else:
                await asyncio.sleep(min(every, 0.2))

    async def _lag_loop(self) -> None:
        stream = self.cfg.subjects.stream_name("KV")
        while True:
            with contextlib.suppress(Exception):
                info = await self.js.stream_info(stream)
                self.metrics.lag.set(max(info.state.last_seq - self.applied, 0))
            await asyncio.sleep(1.0)


async def _first(*events: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def run_indexer(cfg: IndexerConfig) -> None:
    nc = await connect_nats(cfg.nats_url, name=cfg.indexer_id)
    await ensure_topology(nc.jetstream(), cfg.subjects)
    redis = await connect_redis(cfg.redis_url)
    prom = CollectorRegistry()
    if cfg.metrics_port:
        start_ops_server(
            cfg.metrics_port,
            prom,
            nats_connected(nc),
            cfg.metrics_host,
        )
    pending: set[asyncio.Task[None]] = set()

    def live_workers() -> set[str] | None:  # the watch below, once it has read discovery
        return set(watch.live) if watch.synced.is_set() else None

    def gone(worker_id: str) -> None:
        task = asyncio.create_task(indexer.worker_gone(worker_id))
        pending.add(task)
        task.add_done_callback(pending.discard)

    indexer = Indexer(cfg, nc, redis, IndexerMetrics(prom), live_workers)
    watch = WorkerWatch(nc, cfg.subjects, on_joined=indexer.worker_joined, on_gone=gone)
    await watch.start()
    stop = stop_event()
    try:
        await indexer.run(stop)
    finally:
        await watch.stop()
        await close_nats(nc)
        await redis.aclose()
        log.info(
            "indexer_stopped",
            indexer_id=cfg.indexer_id,
            applied_seq=indexer.applied,
            at=time.time(),
        )
