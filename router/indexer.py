"""The KV indexer service: FLEET_KV -> the Redis prefix index.

- **Stateless per block.** Workers send the fleet's own block hashes and say when their blocks
  stop being prefix-closed (``KvEventBatch`` v3): each event is one op on one holder, applied as
  it comes. The indexer keeps per worker only its slot and last event id, so a standby takes over
  with nothing to load, and a restart resumes with nothing to rebuild.
- **Position in Redis, not in the consumer.** Every applied batch writes its stream sequence in
  the same Lua call as the change, per shard, so on start the indexer reads the lowest position
  of its group and reads the stream from the next sequence with an ordered consumer (the fastest
  consumer nats-py has; no acks). A restart resumes exactly; a batch applied twice changes
  nothing.
- **Pipelined.** Messages that have arrived are taken in groups (up to ``batch_max``). A group is
  written as soon as it is prepared, as script calls of at most ``max_blocks_per_call`` block
  events per shard, and its results are read only after the next group was prepared and
  written: Redis applies one group while Python prepares the next.
- **Groups of workers.** FLEET_KV stores each worker's batches under its partition
  (``Subjects.kv_partition_transform``); with ``groups`` > 1 an indexer leads one group and reads
  only its partitions, so several indexers apply at once, each its part of the workers, and
  ingest grows with them (and with the shards they write to). Each group has a leader lock;
  standbys take over within the lock's TTL and resume from the stored positions.
- **Gaps heal.** A batch whose event id skips, or a batch of engine hashes from an older release,
  makes the indexer retire that worker's slots (its blocks are read by nobody from then on) and
  ask the worker (control op ``kv_resync``) to publish its whole cache again.
- **Bounded.** A departure, a clear or a heal retires or renews a slot: one small call, whatever
  the worker held. The sweeper (the leader of group 0) clears retired slots' bits in bounded
  steps and frees them. Snapshots (group 0's leader, every ``snapshot_every_s``) read the index
  in bounded steps beside ingest, never pausing it.
- **Snapshots.** An indexer that starts on an empty index restores the latest one and replays
  only what came after, so FLEET_KV's retention needs to cover just the time since it.
- **Departures.** A worker that leaves discovery has its slots retired, and batches of it still
  in the stream are skipped (until it registers again).
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
from nats.js.errors import BucketNotFoundError, NotFoundError, ObjectNotFoundError
from prometheus_client import CollectorRegistry, Counter, Gauge

from base.connect import close_nats, connect_nats, connect_redis
from base.connection_metrics import ConnectionGauges
from base.consume import DeadLetters
from base.deadletter import DeadLetterMetrics
from base.kv_read import bucket_values
from base.ops_http import nats_connected
from base.ops_presence import serve_ops
from base.signals import stop_event
from base.task_trace import task_where
from base.topology import ensure_topology
from base.worker_watch import WorkerWatch
from router.consume_stall import WHY, Look, StallJudge, stall_after
from router.kv import snapshot as snapshots
from router.kv.keys import LEADER_TTL_MS, namespace
from router.kv.redis_index import (
    MAX_BLOCKS_PER_CALL,
    AppliedLater,
    ApplyItem,
    RedisPrefixIndex,
)
from router.kv.resp import REDIS_UNREACHABLE
from router.kv.translate import count_blocks, legacy, ops_of, worker_of
from schemas import ControlRequest, ModelCard, Subjects, decode, encode
from schemas.kv_events import BlocksSnapshot, IndexSnapshot, KvEventBatch
from schemas.streams import KV_SNAPSHOT_STORE, MODELS_BUCKET
from schemas.subjects import KV_PARTITIONS, kv_partition

_BACKOFF_FIRST_S = 0.25  # Redis unreachable: first wait before leading again
_BACKOFF_MAX_S = 5.0
_STOP_APPLY_S = 10.0  # a stalled consume's apply step, cancelled, must end within this
_HEAL_EVERY_S = 5.0  # a worker is asked to publish its cache again at most this often

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
    index_shards: int = 0
    """Shards of the prefix index (0: as recorded in Redis, else one per Redis Cluster master,
    1 without a cluster). Fixed for a namespace: every indexer and router reads the record."""
    groups: int = 1
    """Indexer groups: each leads a part of the workers (FLEET_KV's partitions), so this many
    indexers apply at once (more run as standbys). Every indexer of a fleet uses the same."""
    group: int = -1  # the group to lead (-1: the first whose leader is missing)
    max_blocks_per_call: int = MAX_BLOCKS_PER_CALL
    """Block events one Redis call applies at most (a route waits for no longer call)."""
    sweep_every_s: float = 1.0  # how often retired slots are looked for (group 0's leader)
    stall_after_s: float = 30.0
    """A consume whose position stands still this long while messages wait (or a step runs)
    is logged (``indexer_consume_stalled``) and started again from the stored position (0:
    never). Longer than nats-py's own recovery of an ordered consumer (two missed 5-s
    heartbeats) and than a Redis call's timeout."""


class ApplyStuckError(RuntimeError):
    """An apply step of a stalled consume did not end when cancelled."""


class _Step:
    """Where the apply loop is: in a step since a time, or waiting for messages (None)."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.abort = False  # the consume stalled: the loop ends without finishing

    def begin(self) -> None:
        self.since = time.monotonic()

    def wait(self) -> None:
        self.since = None

    def busy_s(self) -> float | None:
        return None if self.since is None else time.monotonic() - self.since


@dataclass
class _Prepared:
    items: list[ApplyItem] = field(default_factory=list)
    batches: list[KvEventBatch | None] = field(default_factory=list)  # None: nothing to count
    heals: list[tuple[str, str, str]] = field(default_factory=list)  # model, worker, reason


def _heals_of(prep: _Prepared, started: AppliedLater) -> list[tuple[str, str, str]]:
    """The heals a group asks for: its own, then each applied batch's event id gap, known when
    the group was written (``_finish`` does them; a stalled consume carries them over)."""
    heals = list(prep.heals)
    for batch, res in zip(prep.batches, started.known(), strict=True):
        if batch is not None and res.applied and res.gap:
            heals.append((batch.model, batch.worker_id, "event id gap"))
    return heals


def _stream_seq(msg: Msg) -> int:
    """A JetStream message's stream sequence, read from its reply subject
    ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ts>.<pending>``
    (``msg.metadata`` also builds a datetime and two dataclasses per message); nats-py parses
    any other form (with domain and account)."""
    tokens = msg.reply.split(".")
    if len(tokens) == 9 and tokens[0] == "$JS" and tokens[1] == "ACK":
        return int(tokens[5])
    return int(msg.metadata.sequence.stream)


class IndexerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        ns = "jetfleet_indexer"
        self.registry = registry
        self.dead_letters = DeadLetterMetrics(registry)
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
        self.swept = Counter(
            f"{ns}_slots_swept", "Retired slots cleared and freed", registry=registry
        )
        self.stalls = Counter(
            f"{ns}_consume_stalls",
            "Consumes started again after their position stood still with messages waiting",
            ["reason"],
            registry=registry,
        )
        self.snapshot_s = Gauge(
            f"{ns}_snapshot_seconds", "How long the last snapshot took", registry=registry
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
        self.letters = DeadLetters(nc, cfg.subjects, "indexer", metrics.dead_letters)
        self.redis = redis
        self.index = RedisPrefixIndex(
            redis,
            namespace(cfg.subjects.prefix),
            cfg.index_shards,
            cfg.max_blocks_per_call,
            writer=True,
        )
        self.metrics = metrics
        self.worker_models: dict[str, str] = {}
        self.departed: set[str] = set()  # left discovery: their late events are ignored
        self.live_workers = live_workers
        self.group = -1  # the group led, while leading
        self.applied = 0
        self._snapshot_at = time.monotonic()
        self._snapshot_seq = 0
        self._healed: dict[str, float] = {}
        self._resuming = False  # Redis was lost while this indexer may have led
        self._owed_heals: list[tuple[str, str, str]] = []  # left by a stalled consume
        self.log = log.bind(indexer_id=cfg.indexer_id)

    # ------------------------------------------------------------------ groups
    def _partitions(self, group: int) -> list[int]:
        return [p for p in range(KV_PARTITIONS) if p % self.cfg.groups == group]

    def owns(self, worker_id: str) -> bool:
        """Whether the worker's batches are this indexer's to apply (its group's partitions)."""
        if self.cfg.groups <= 1:
            return True
        return kv_partition(worker_of(worker_id)) % self.cfg.groups == self.group

    # ------------------------------------------------------------------ leadership
    async def _lock(self) -> tuple[Any, str]:
        shards = await self.index.ready()
        return shards[0].redis, shards[0].keys.leader(max(self.group, 0))

    async def _renew(self, redis: Any, key: str) -> int:
        return int(
            await redis.eval(_RENEW, 1, key, self.cfg.indexer_id, self.cfg.leader_ttl_ms) or 0
        )

    async def acquire(self) -> bool:
        """Take a group's lock (its own, or the first free one), or, after losing Redis while
        leading, keep it: the promoted replica may hold this indexer's lock (replicated), which
        is still its own to renew."""
        resuming, self._resuming = self._resuming, False
        shards = await self.index.ready()
        redis = shards[0].redis
        wanted = [self.cfg.group] if self.cfg.group >= 0 else list(range(max(self.cfg.groups, 1)))
        if resuming and self.group >= 0:
            key = shards[0].keys.leader(self.group)
            if await self._renew(redis, key):
                return True
        for g in wanted:
            key = shards[0].keys.leader(g)
            if await redis.set(key, self.cfg.indexer_id, nx=True, px=self.cfg.leader_ttl_ms):
                self.group = g
                self.index.group = g
                return True
        return False

    async def _keep_leadership(self, lost: asyncio.Event) -> None:
        while True:
            await asyncio.sleep(self.cfg.leader_ttl_ms / 3000)
            try:
                redis, key = await self._lock()
                ok = await self._renew(redis, key)
            except Exception as exc:
                self.log.warning("leader_renew_failed", error=str(exc))
                ok = 0
            if not ok:
                lost.set()
                return

    async def release_leadership(self) -> None:
        with contextlib.suppress(Exception):
            redis, key = await self._lock()
            if await redis.get(key) == self.cfg.indexer_id.encode():
                await redis.delete(key)

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
        """Wait for a lock, or lead until stopped or the lock is lost."""
        if not await self.acquire():
            self.metrics.leader.set(0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_first(stop, halt), self.cfg.leader_ttl_ms / 2000)
            return
        self.metrics.leader.set(1)
        self.index.reset()
        self.log.info("indexer_leading", group=self.group, groups=self.cfg.groups)
        lost = asyncio.Event()
        keeper = asyncio.create_task(self._keep_leadership(lost))
        try:
            restarts = 0  # stalled: again, on a new consumer, while this indexer still leads
            while await self._consume(stop, lost, halt, restarts=restarts) and not (
                stop.is_set() or lost.is_set() or halt.is_set()
            ):
                restarts += 1
                self.index.reset()
        except REDIS_UNREACHABLE:
            # Redis went away while this indexer led: the promoted replica may still hold its
            # lock (to renew, not to wait out), and may be behind what it applied, so what this
            # process cached of the index is dropped and read again, as on a restart
            self._resuming = True
            self.index.reset()
            self.worker_models.clear()
            raise
        finally:
            keeper.cancel()
            self.metrics.leader.set(0)
            await self.release_leadership()

    async def _store(self) -> Any:
        return await self.js.object_store(self.cfg.subjects.bucket_name(KV_SNAPSHOT_STORE))

    async def restore_snapshot(self) -> bool:
        """Load the latest snapshot into an empty index; whether one was used."""
        if await self._any_position():
            return False
        store = await self._store()
        try:
            obj = await store.get(SNAPSHOT_OBJECT)
            snap = decode(obj.data or b"", IndexSnapshot)
        except ObjectNotFoundError:
            return False
        except Exception as exc:  # another layout's snapshot: replay the stream instead
            self.log.warning("indexer_snapshot_unusable", error=str(exc))
            return False

        async def get_part(name: str) -> BlocksSnapshot:
            return decode((await store.get(name)).data or b"", BlocksSnapshot)

        try:
            await snapshots.restore(self.index, snap, get_part)
        except (ValueError, ObjectNotFoundError) as exc:
            self.log.warning("indexer_snapshot_unusable", error=str(exc))
            return False
        self.log.info("indexer_restored_snapshot", positions=snap.positions, parts=len(snap.parts))
        return True

    async def _any_position(self) -> bool:
        shards = await self.index.ready()
        for s in shards.shards:
            if await s.redis.hlen(s.keys.pos):
                return True
        return False

    async def snapshot(self) -> int:
        """Write the index to the object store (beside ingest); returns the lowest position it
        records for this indexer's group. Raises ``RuntimeError``, and keeps the last snapshot,
        when the shards' epoch keys changed while it read (a FLUSHALL, a failover to an empty
        replica, or a rebuild since: see ``check_epoch``)."""
        t0 = time.monotonic()
        store = await self._store()
        name = f"part-{int(time.time() * 1000)}"

        async def put_part(part: str, blocks: BlocksSnapshot) -> None:
            await store.put(part, encode(blocks))

        epochs = await self._epochs()
        snap = await snapshots.export(self.index, put_part, name)
        if not all(epochs) or await self._epochs() != epochs:
            # flushed (or lost and rebuilt) while it was read: blocks read after the flush are
            # missing, and restoring them under the positions read before would keep a partial
            # index for good
            for part in snap.parts:
                with contextlib.suppress(Exception):
                    await store.delete(part)
            raise RuntimeError("the index changed epoch while it was read: snapshot discarded")
        old: tuple[str, ...] = ()
        with contextlib.suppress(Exception):
            old = decode((await store.get(SNAPSHOT_OBJECT)).data or b"", IndexSnapshot).parts
        await store.put(SNAPSHOT_OBJECT, encode(snap))
        for part in set(old) - set(snap.parts):
            with contextlib.suppress(Exception):
                await store.delete(part)
        self._snapshot_at = time.monotonic()
        seq = min((p.get(str(max(self.group, 0)), 0) for p in snap.positions), default=0)
        self._snapshot_seq = seq
        self.metrics.snapshot_s.set(time.monotonic() - t0)
        self.log.info("indexer_snapshot_written", seq=seq, parts=len(snap.parts))
        return seq

    async def _snapshot_loop(self, on: Callable[[], bool]) -> None:
        """Group 0's leader: a snapshot every ``snapshot_every_s`` while the index changes."""
        every = self.cfg.snapshot_every_s
        if every <= 0:
            return
        while on():
            await asyncio.sleep(min(every, 1.0))
            if self.applied <= self._snapshot_seq or time.monotonic() - self._snapshot_at < every:
                continue
            try:
                if await self.check_epoch(wipe=False):
                    await self.snapshot()
            except Exception as exc:  # the next interval retries; replay just gets longer
                self.log.warning("indexer_snapshot_failed", error=str(exc))
            self._snapshot_at = time.monotonic()

    async def _sweep_loop(self, on: Callable[[], bool]) -> None:
        """Group 0's leader: clear retired slots' bits and free them."""
        while on():
            await asyncio.sleep(self.cfg.sweep_every_s)
            try:
                for model in sorted(await self.index.models()):
                    freed = await self.index.sweep(model)
                    if freed:
                        self.metrics.swept.inc(freed)
                        self.log.info("indexer_swept_slots", model=model, freed=freed)
            except Exception as exc:  # Redis away: the next round retries
                self.log.warning("indexer_sweep_failed", error=repr(exc))

    async def check_epoch(self, wipe: bool = True) -> bool:
        """Whether the index in Redis can be trusted; a partial one is wiped first.

        A FLUSHALL, or a failover to an empty replica, empties Redis (or one node of a cluster)
        under a running fleet: the next apply writes its stream position into the empty shard,
        and an indexer that resumed from that position would keep a partial index for good (and
        snapshot it). Each shard's epoch key is written with its first position and vanishes
        with the rest: a shard with a position but no epoch, or an epoch missing while another
        shard has one, is such a partial index. The whole index is then wiped (routing
        reservations are left alone), so the snapshot restore and the replay rebuild it. A new
        epoch (the indexer's id and a random token) is written where one was missing, so a
        snapshot read across a flush or a rebuild sees it change and is discarded.
        Returns False when it was not intact."""
        shards = await self.index.ready()
        epochs = [e is not None for e in await self._epochs()]
        positions = [bool(await s.redis.hlen(s.keys.pos)) for s in shards.shards]
        intact = all(epochs) or (not any(epochs) and not any(positions))
        if not wipe:
            return intact
        if not intact:
            wiped = 0
            for s in shards.shards:
                doomed = [
                    key
                    async for key in s.redis.scan_iter(match=f"{_glob(s.keys.base)}:*", count=1000)
                    if not s.keys.is_reservation(key.decode())
                ]
                for i in range(0, len(doomed), 500):  # one round trip per 500 keys
                    wiped += await s.redis.delete(*doomed[i : i + 500])
            self.index.reset()
            self.worker_models.clear()
            self.log.warning("indexer_rebuilding_lost_index", wiped_keys=wiped)
        if intact and all(epochs):
            return True  # kept: another group's lead does not void a snapshot being read
        epoch = f"{self.cfg.indexer_id}:{uuid.uuid4().hex[:8]}"  # a snapshot compares it
        for s in shards.shards:
            await s.redis.set(s.keys.epoch, epoch)
        return intact

    async def _epochs(self) -> list[bytes | None]:
        """Each shard's epoch key (None where it is missing)."""
        shards = await self.index.ready()
        return [await s.redis.get(s.keys.epoch) for s in shards.shards]

    async def _consume(self, *stops: asyncio.Event, restarts: int = 0) -> bool:
        """Apply the stream from the stored position until one of ``stops`` is set. Returns
        True when it ended because it stalled (see ``consume_stall``; ``restarts``: how many
        times in a row it did before): the caller consumes again, from the stored position, on
        a new consumer. An apply step that cannot be stopped raises ``ApplyStuckError``: the
        process exits rather than lead with two loops writing."""
        await self.check_epoch()
        await self.restore_snapshot()
        start = await self.index.applied_seq() + 1
        self.applied = start - 1
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def on_msg(msg: Msg) -> None:
            queue.put_nowait(msg)

        config = api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start
        )
        subject = self.cfg.subjects.kv_all()
        if self.cfg.groups > 1:
            config.filter_subjects = self.cfg.subjects.kv_partitions(self._partitions(self.group))
            subject = ""
        sub = await self.js.subscribe(
            subject,
            stream=self.cfg.subjects.stream_name("KV"),
            cb=on_msg,
            ordered_consumer=True,
            config=config,
        )
        self.log.info("indexer_consuming", from_seq=start, group=self.group)
        # the side loops also stop on the flag: a cancel can be swallowed (see ``run``)
        ended = False

        def on() -> bool:
            return not ended

        tasks = [
            asyncio.create_task(self._lag_loop(on)),
            asyncio.create_task(self._reconcile_loop(await self._tail_seq(), on)),
        ]
        if self.group <= 0:
            tasks += [
                asyncio.create_task(self._sweep_loop(on)),
                asyncio.create_task(self._snapshot_loop(on)),
            ]
        stopper = asyncio.create_task(_first(*stops))
        step = _Step()
        applying = asyncio.create_task(self._apply_loop(queue, stopper, step))
        watcher: asyncio.Task[str] | None = None
        if self.cfg.stall_after_s > 0:
            after = stall_after(self.cfg.stall_after_s, restarts)
            watcher = asyncio.create_task(self._watch_stall(sub, queue, step, applying, after, on))
        stalled = False
        try:
            while not applying.done():
                watched = {applying} if watcher is None else {applying, watcher}
                await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
                if watcher is None or not watcher.done() or applying.done():
                    continue
                if watcher.exception() is None:
                    stalled = True
                    break
                self.log.error("indexer_stall_watch_failed", error=repr(watcher.exception()))
                watcher = None  # consume on, unwatched
            if applying.done():
                applying.result()  # a Redis outage, say, goes on up
        finally:
            ended = step.abort = True
            stopper.cancel()
            if watcher is not None:
                watcher.cancel()
            if not applying.done():
                applying.cancel()
                await asyncio.wait({applying}, timeout=_STOP_APPLY_S)
            for t in tasks:
                t.cancel()
            # a side loop in a long step (a sweep, a snapshot) is left to end on its own
            await asyncio.wait(tasks, timeout=5.0)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if stalled and not applying.done():  # its cancel swallowed, still in a step
            self.log.error("indexer_apply_stuck", where=task_where(applying))
            raise ApplyStuckError("an apply step of a stalled consume could not be stopped")
        if stalled and not applying.cancelled() and applying.exception() is not None:
            applying.result()  # it failed on its way out (Redis lost, say): as any failure
        return stalled

    async def _apply_loop(
        self, queue: asyncio.Queue[Any], stopper: asyncio.Task[None], step: _Step
    ) -> None:
        """Take the messages that arrived, in groups; apply each group while the next is
        prepared; until ``stopper`` is done (or ``step.abort``: a stalled consume)."""
        flight: tuple[_Prepared, AppliedLater] | None = None
        getter: asyncio.Future[Any] | None = None
        owed, self._owed_heals = self._owed_heals, []
        for heal in owed:  # of a group whose apply a stalled consume left unread
            step.begin()
            await self._heal(*heal)
        try:
            while not (stopper.done() or step.abort):
                if flight is not None and queue.empty():  # nothing to overlap it with
                    step.begin()
                    await self._finish(*flight)
                    flight = None
                step.wait()
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    break
                step.begin()
                msgs = [getter.result()]
                while len(msgs) < self.cfg.batch_max and not queue.empty():
                    msgs.append(queue.get_nowait())
                prepared = await self._prepare(msgs)  # while Redis applies the previous group
                started = await self.index.start_apply(prepared.items)
                if flight is not None:
                    await self._finish(*flight)
                flight = (prepared, started)
            if flight is not None and not step.abort:
                await self._finish(*flight)
                flight = None
        finally:
            if getter is not None:
                getter.cancel()
            if flight is not None:  # written, its results never read: heal what they asked
                self._owed_heals += _heals_of(*flight)

    async def _watch_stall(
        self,
        sub: Any,
        queue: asyncio.Queue[Any],
        step: _Step,
        applying: asyncio.Task[None],
        after_s: float,
        on: Callable[[], bool],
    ) -> str:
        """Return once the consume stalled (``consume_stall``), after logging what tells the
        causes apart: where the loop waits, what the client holds, what the server says. The
        server is asked (one request) only when the position has not moved since the last look."""
        judge = StallJudge(after_s)
        every = min(1.0, after_s / 4)
        last = self.applied
        while on():
            await asyncio.sleep(every)
            pending: int | None = 0
            server: dict[str, Any] = {}
            if self.applied == last:
                try:
                    info = await sub.consumer_info()
                    pending = int(info.num_pending or 0)
                    server = {"consumer": info.name, "delivered_seq": info.delivered.stream_seq}
                except NotFoundError:
                    pending = None  # gone (nats-py makes it again after two missed heartbeats)
                except Exception as exc:  # NATS away or slow: its client reconnects; look again
                    self.log.debug("indexer_stall_look_failed", error=repr(exc))
                    continue
            last = self.applied
            look = Look(time.monotonic(), last, queue.qsize(), step.since is not None, pending)
            reason = judge.verdict(look)
            if reason is None:
                continue
            busy_s = step.busy_s()
            self.metrics.stalls.labels(reason).inc()
            self.log.warning(
                "indexer_consume_stalled",
                reason=reason,
                why=WHY[reason],
                applied_seq=self.applied,
                waited_s=round(judge.waited_s(look.at), 1),
                queued=look.waiting,
                step_s=None if busy_s is None else round(busy_s, 1),
                server_pending=pending,
                client_pending=sub.pending_msgs,
                client_delivered=sub.delivered,
                where=task_where(applying),
                **server,
            )
            return reason
        return ""

    async def _prepare(self, msgs: list[Any]) -> _Prepared:
        """Decode, and map events to ops (CPU only, but for a new holder's slot)."""
        prep = _Prepared()
        for msg in msgs:
            seq = _stream_seq(msg)
            # undecodable: dead-lettered (not terminated: the indexer moves on by stream position)
            # and applied as an empty item, as is a late batch of a worker already dropped
            batch = await self.letters.decoded(msg, KvEventBatch, terminate=False)
            if batch is None:
                self.metrics.dead.inc()
            elif legacy(batch):  # engine hashes of an older release: not placeable
                self.metrics.dead.inc()
                prep.heals.append((batch.model, batch.worker_id, "batch of engine hashes (v<3)"))
                batch = None
            if batch is None or batch.worker_id in self.departed:
                prep.items.append(("", "", 0, seq, ()))
                prep.batches.append(None)
                continue
            self.worker_models[batch.worker_id] = batch.model
            prep.items.append((batch.model, batch.worker_id, batch.event_id, seq, ops_of(batch)))
            prep.batches.append(batch)
        return prep

    async def _finish(self, prep: _Prepared, started: AppliedLater) -> None:
        """Read a group's results (in group order): heal, count, move ``applied``."""
        results = await started.results()
        for heal in _heals_of(prep, started):
            await self._heal(*heal)
        stored = removed = cleared = batches = 0
        for item, batch, res in zip(prep.items, prep.batches, results, strict=True):
            if batch is not None and res.applied:
                batches += 1
                s, r, c = count_blocks(batch)
                stored, removed, cleared = stored + s, removed + r, cleared + c
            self.applied = max(self.applied, item[3])
        self.metrics.batches.inc(batches)
        for kind, n in (("stored", stored), ("removed", removed), ("cleared", cleared)):
            if n:
                self.metrics.blocks.labels(kind).inc(n)
        self.metrics.applied_seq.set(self.applied)

    async def _heal(self, model: str, worker_id: str, reason: str) -> None:
        """Retire the worker's slots and ask it for its whole cache (at most every
        ``_HEAL_EVERY_S``: a worker of an older release cannot answer as asked)."""
        self.metrics.gaps.inc()
        self.log.warning("indexer_healing_worker", worker_id=worker_id, model=model, reason=reason)
        await self.index.drop_worker(model, worker_id)
        now = time.monotonic()
        if now - self._healed.get(worker_id, -_HEAL_EVERY_S) < _HEAL_EVERY_S:
            return
        self._healed[worker_id] = now
        with contextlib.suppress(Exception):
            await self.nc.publish(
                self.cfg.subjects.ctl(worker_id, "kv_resync"), encode(ControlRequest())
            )

    def worker_joined(self, worker_id: str) -> None:
        self.departed.discard(worker_id)

    async def worker_gone(self, worker_id: str) -> None:
        if not self.owns(worker_id):
            return
        self.departed.add(worker_id)
        model = self.worker_models.pop(worker_id, None)
        if model is None:
            return
        try:
            await self.index.drop_worker(model, worker_id)
        except REDIS_UNREACHABLE as exc:  # the periodic reconcile drops it once Redis answers
            self.log.warning("indexer_drop_failed", worker_id=worker_id, error=repr(exc))
            return
        self.log.info("indexer_dropped_worker", worker_id=worker_id, model=model)

    async def reconcile(self, live: set[str]) -> list[str]:
        """Drop every indexed worker of this group discovery does not know: workers that left
        while no indexer ran never had their departure seen, and a replay or a snapshot brings
        their blocks back. Returns the dropped worker ids."""
        dropped: list[str] = []
        for model in sorted(await self._models()):
            indexed = {worker_of(h) for h in await self.index.workers(model)}
            for worker_id in sorted(w for w in indexed - live if self.owns(w)):
                self.worker_models.setdefault(worker_id, model)
                await self.worker_gone(worker_id)
                dropped.append(worker_id)
        if dropped:
            self.log.info("indexer_reconciled", dropped=dropped)
        return dropped

    async def _models(self) -> set[str]:
        """The models with indexed workers: seen in the stream, registered, or in the index."""
        models = set(self.worker_models.values())
        with contextlib.suppress(Exception):
            models |= await self.index.models()
        try:
            kv = await self.js.key_value(self.cfg.subjects.bucket_name(MODELS_BUCKET))
            for value in (await bucket_values(kv, timeout_s=5.0)).values():
                if value:
                    models.add(decode(value, ModelCard).name)
        except BucketNotFoundError:  # no worker has registered a model yet
            pass
        except Exception as exc:  # NATS slow or away: the next round reads them again
            self.log.warning("indexer_models_unread", error=repr(exc))
        return models

    async def _tail_seq(self) -> int:
        with contextlib.suppress(Exception):
            info = await self.js.stream_info(self.cfg.subjects.stream_name("KV"))
            return int(info.state.last_seq)
        return 0

    async def _reconcile_loop(self, tail: int, on: Callable[[], bool]) -> None:
        """Once caught up with the stream (``tail``: its end when consuming began) and discovery
        has been read in full, reconcile; then every ``reconcile_every_s``."""
        every = self.cfg.reconcile_every_s
        if every <= 0:
            return
        while on():
            live = self.live_workers()
            if live is not None and self.applied >= tail:
                try:
                    await self.reconcile(live)
                except Exception as exc:  # Redis away: the next round retries
                    self.log.warning("indexer_reconcile_failed", error=repr(exc))
                await asyncio.sleep(every)
            else:
                await asyncio.sleep(min(every, 0.2))

    async def _lag_loop(self, on: Callable[[], bool]) -> None:
        stream = self.cfg.subjects.stream_name("KV")
        while on():
            with contextlib.suppress(Exception):
                info = await self.js.stream_info(stream)
                self.metrics.lag.set(max(info.state.last_seq - self.applied, 0))
            await asyncio.sleep(1.0)


def _glob(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


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
    presence = await serve_ops(
        nc,
        cfg.subjects,
        "indexer",
        cfg.metrics_port,
        prom,
        nats_connected(nc),
        cfg.metrics_host,
        instance=cfg.indexer_id,
    )
    connections = ConnectionGauges(prom, nc, redis).start()
    pending: set[asyncio.Task[None]] = set()

    def live_workers() -> set[str] | None:  # the watch below, once it has read discovery
        return set(watch.live) if watch.synced.is_set() else None

    def gone(worker_id: str) -> None:
        task = asyncio.create_task(indexer.worker_gone(worker_id))
        pending.add(task)
        task.add_done_callback(pending.discard)

    indexer = Indexer(cfg, nc, redis, IndexerMetrics(prom), live_workers)
    watch = WorkerWatch(nc, cfg.subjects, on_joined=indexer.worker_joined, on_gone=gone, judge=True)
    await watch.start()
    stop = stop_event()
    try:
        await indexer.run(stop)
    finally:
        if presence is not None:
            await presence.stop()
        connections.cancel()
        await watch.stop()
        await close_nats(nc)
        await redis.aclose()
        log.info(
            "indexer_stopped",
            indexer_id=cfg.indexer_id,
            applied_seq=indexer.applied,
            at=time.time(),
        )
