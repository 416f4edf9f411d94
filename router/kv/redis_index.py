"""The shared prefix index in Redis (layout in ``keys``, scripts in ``lua``).

Every mutation is one Lua script carrying the stream sequence it applies, so the change and the
position are one atomic write: a redelivered batch (sequence <= applied) changes nothing, and an
indexer restart resumes at ``applied_seq() + 1``. ``apply_many`` applies many batches in one
script call (``max_blocks_per_call`` bounds how long one call holds Redis) and pipelines the calls
into one round trip. A match and a routing decision are one script call each, whatever the prompt
length and the number of workers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import msgspec
from redis.exceptions import NoScriptError

from router.kv import lua
from router.kv.index import ApplyResult
from router.kv.keys import KvKeys, pack_hashes, unpack_blob, unpack_hash
from router.kv.resp import RespPipe
from router.kv.routing import RouteCall, RouteOutcome
from router.kv.shape import UNKNOWN
from router.kv.translate import ClearOp, IndexOp, ShapeOp, StoreOp
from schemas.kv_events import IndexSnapshot, WorkerIndexSnapshot

ApplyItem = tuple[str, str, int, int, Sequence[IndexOp]]  # model, worker, event id, seq, ops
Arg = str | int | float | bytes

MAX_BLOCKS_PER_CALL = 1024  # ~3-4 ms of Redis time here: a longer call would stall routing calls


def _add_ops(args: list[Arg], worker_id: str, ops: Sequence[IndexOp]) -> tuple[int, int]:
    """Append the ops in APPLY_MANY's format (a ``W`` op before each run of ops of another
    holder than the last: a tier of the batch's worker); returns (ops, block hashes) added."""
    blocks = n_ops = 0
    current = worker_id
    for op in ops:
        if op.worker_id != current:
            current = op.worker_id
            args += ("W", current)
            n_ops += 1
        n_ops += 1
        if isinstance(op, ClearOp):
            args.append("C")
        elif isinstance(op, ShapeOp):
            args += ("H", 1 if op.hole_free else 0)
        else:
            engine = pack_hashes(op.engine_hashes)
            # the same tuple: the engine hashes like the fleet (translator, routing hints)
            same = op.fleet_hashes is op.engine_hashes or op.fleet_hashes == op.engine_hashes
            fleet = b"" if same else pack_hashes(op.fleet_hashes)
            if isinstance(op, StoreOp):
                args += ("S", engine, fleet, _parent_arg(op.parent))
            else:
                args += ("R", engine, fleet)
            blocks += len(op.engine_hashes)
    return n_ops, blocks


def _parent_arg(parent: int | None) -> bytes:
    if parent is None:
        return b""
    return b"?" if parent == UNKNOWN else parent.to_bytes(8, "big")


def _map_entry(engine: bytes, value: bytes) -> tuple[bytes, int | None]:
    """(fleet hash, parent) of a map entry (value layout in ``keys``); parent ``UNKNOWN`` if the
    index does not have it."""
    n = len(value)
    if n < 9:
        fleet = engine
        parent = None if n == 0 else UNKNOWN if n == 1 else unpack_hash(value)
    else:
        fleet = value[:8]
        tail = value[8:]
        parent = unpack_hash(tail) if len(tail) == 8 else None if tail == b"r" else UNKNOWN
    return fleet, parent


class AppliedLater:
    """The results of started apply calls: one flag per batch, in order."""

    def __init__(
        self,
        replies: Sequence[Any],
        wait: Callable[[Sequence[asyncio.Future[Any]]], Awaitable[list[Any]]] | None = None,
    ) -> None:
        self._replies = replies  # futures (lean pipe, read by ``wait``: bounded) or replies
        self._wait = wait

    async def results(self) -> list[ApplyResult]:
        replies = await self._wait(self._replies) if self._wait is not None else self._replies
        return [_RESULTS[f] for f in b"".join(replies)]


@dataclass(frozen=True)
class WorkerBlocks:
    """A worker's entries, to refill the indexer's translator after a restart."""

    mapping: dict[int, int]  # engine hash -> fleet hash
    parents: dict[int, int | None]  # held fleet block -> its parent (None root, UNKNOWN)


class RedisPrefixIndex:
    def __init__(
        self,
        redis: Any,
        keys: KvKeys,
        max_blocks_per_call: int = MAX_BLOCKS_PER_CALL,
        lean: bool = True,
    ) -> None:
        """``lean``: script calls on a ``RespPipe`` to the client's server when the client is a
        plain TCP / unix-socket one (else, or when False, through redis-py)."""
        self.redis = redis
        self.keys = keys
        self.ns = keys.base
        self.max_blocks_per_call = max_blocks_per_call
        self._sha: dict[str, str] = {}
        self._pipe = RespPipe.for_client(redis) if lean else None

    async def _script(self, src: str, *args: Arg) -> Any:
        """One script call (EVALSHA; the script is loaded on first use and after a Redis
        restart), on the lean pipe when there is one."""
        sha = self._sha.get(src) or await self._load(src)
        try:
            return await self._evalsha(sha, args)
        except NoScriptError:  # Redis restarted (these calls are not pipelined: retry is safe)
            return await self._evalsha(await self._load(src), args)

    async def _evalsha(self, sha: str, args: Sequence[Arg]) -> Any:
        if self._pipe is not None:
            return await self._pipe.call("EVALSHA", sha, 0, *args)
        return await self.redis.execute_command("EVALSHA", sha, 0, *args)

    async def apply(
        self, model: str, worker_id: str, event_id: int, stream_seq: int, ops: Sequence[IndexOp]
    ) -> ApplyResult:
        return (await self.apply_many([(model, worker_id, event_id, stream_seq, ops)]))[0]

    def _calls(self, items: Sequence[ApplyItem]) -> list[list[Arg]]:
        calls: list[list[Arg]] = []
        args: list[Arg] = [self.ns]
        blocks = 0
        for model, worker_id, event_id, seq, ops in items:
            args += (model, worker_id, event_id, seq, 0)
            at = len(args) - 1
            n_ops, n_blocks = _add_ops(args, worker_id, ops)
            args[at] = n_ops
            blocks += n_blocks
            if blocks >= self.max_blocks_per_call:
                calls.append(args)
                args, blocks = [self.ns], 0
        if len(args) > 1:
            calls.append(args)
        return calls

    async def apply_many(self, items: Sequence[ApplyItem]) -> list[ApplyResult]:
        """Apply batches (model, worker, event id, stream seq, ops) in stream order: one script
        call per ``max_blocks_per_call`` block events, all pipelined in one round trip."""
        return await (await self.start_apply(items)).results()

    async def start_apply(self, items: Sequence[ApplyItem]) -> AppliedLater:
        """Write the batches now and read their results later (``AppliedLater.results``), so the
        caller can prepare and write the next ones meanwhile: on the lean pipe, calls are executed
        in the order they were started. (Through redis-py this waits for the results.)

        Apply calls use EVAL with the script body, not EVALSHA: Redis caches the compiled script
        by its SHA1 anyway (hashing the ~14 KB body costs ~20 µs a call of up to
        ``max_blocks_per_call`` block events), and a Redis restart cannot fail a call with
        NOSCRIPT, whose retry could land after calls written behind it and lose its batches."""
        if not items:
            return AppliedLater([])
        calls = [("EVAL", lua.APPLY_MANY, 0, *args) for args in self._calls(items)]
        if self._pipe is not None:
            return AppliedLater(await self._pipe.send_many(calls), self._pipe.replies)
        pipe = self.redis.pipeline(transaction=False)
        for c in calls:
            pipe.execute_command(*c)
        return AppliedLater(await pipe.execute())

    async def warm(self) -> None:
        """Load the routing scripts and open the lean connection before the first request, so
        a burst at start-up does not pay for it (measured: 20-50 ms on each of the first 16
        routes of a cold frontend otherwise, every one of them loading the scripts itself)."""
        for src in (lua.ROUTE, lua.RELEASE, lua.MATCH):
            await self._load(src)
        if self._pipe is not None:
            await self._pipe.call("PING")

    async def _load(self, src: str) -> str:
        sha: str = await self.redis.script_load(src)
        self._sha[src] = sha
        return sha

    async def match(self, model: str, block_hashes: Sequence[int]) -> dict[str, int]:
        flat = await self._script(lua.MATCH, self.ns, model, pack_hashes(block_hashes))
        return {_s(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}

    async def drop_worker(self, model: str, worker_id: str, stream_seq: int = 0) -> None:
        await self._script(lua.DROP_WORKER, self.ns, model, worker_id, stream_seq)

    async def applied_seq(self) -> int:
        v = await self.redis.hget(self.keys.pos, "seq")
        return int(v) if v else 0

    async def worker_mapping(self, model: str, worker_id: str) -> dict[int, int]:
        raw = await self.redis.hgetall(self.keys.map(model, worker_id))
        return {unpack_hash(e): unpack_hash(_map_entry(e, v)[0]) for e, v in raw.items()}

    async def worker_blocks(self, model: str, worker_id: str) -> WorkerBlocks:
        """The worker's mapping, and the parent of each fleet block whose holder bit is set (a
        removal clears the bit even while another engine hash still maps to the block)."""
        raw = await self.redis.hgetall(self.keys.map(model, worker_id))
        entries = {e: _map_entry(e, v) for e, v in raw.items()}
        mapping = {unpack_hash(e): unpack_hash(f) for e, (f, _) in entries.items()}
        parents: dict[int, int | None] = {}
        slot = await self.redis.hget(self.keys.slot(model), worker_id)
        if slot is not None and entries:
            byte_i, mask = divmod(int(slot), 8)
            mask = 0x80 >> mask
            by_fleet = {f: p for f, p in entries.values()}
            fleet = list(by_fleet)
            for lo in range(0, len(fleet), 4096):
                part = fleet[lo : lo + 4096]
                bitmaps = await self.redis.hmget(self.keys.blocks(model), part)
                for f, bm in zip(part, bitmaps, strict=True):
                    if bm and len(bm) > byte_i and bm[byte_i] & mask:
                        parents[unpack_hash(f)] = by_fleet[f]
        return WorkerBlocks(mapping, parents)

    async def workers(self, model: str) -> set[str]:
        with_slot = await self.redis.hkeys(self.keys.slot(model))
        with_evid = await self.redis.hkeys(self.keys.evid(model))
        return {_s(w) for w in (*with_slot, *with_evid)}

    async def route(self, call: RouteCall) -> RouteOutcome:
        c = call.candidates
        cands = _msgpack.encode(
            (
                list(map(_worker_id, c)),
                list(map(_prefill, c)),
                list(map(_decode, c)),
                list(map(_hint, c)),
            )
        )
        out = await self._script(
            lua.ROUTE,
            self.ns,
            call.model,
            call.request_id,
            call.now_ms,
            call.ttl_ms,
            call.prefill_weight,
            call.temperature,
            call.rand,
            call.new_blocks,
            cands,
            pack_hashes(call.block_hashes),
            call.prefill_overhead_blocks,
            call.host_weight,
        )
        winner, overlaps, costs, loads = _route_reply.decode(out)
        return RouteOutcome(c[winner - 1].worker_id, overlaps, costs, loads)

    async def release(self, request_id: str, prefill_only: bool = False) -> bool:
        part = "prefill" if prefill_only else "all"
        return bool(await self._script(lua.RELEASE, self.ns, request_id, part))

    async def reserved(self, model: str, worker_id: str) -> tuple[int, int]:
        p = await self.redis.hget(self.keys.load_prefill(model), worker_id)
        d = await self.redis.hget(self.keys.load_decode(model), worker_id)
        return int(p or 0), int(d or 0)

    async def _maps(self) -> Any:
        """(model, worker, engine -> fleet raw mapping) of every worker with blocks."""
        prefix = self.keys.map_prefix()
        async for key in self.redis.scan_iter(match=f"{prefix}*", count=1000):
            model, worker = _s(key)[len(prefix) :].rsplit(":", 1)
            raw = await self.redis.hgetall(key)
            yield model, worker, {e: _map_entry(e, v)[0] for e, v in raw.items()}

    async def dump(self) -> dict[str, dict[int, frozenset[str]]]:
        """model -> block -> holders, rebuilt from the maps (for equality checks)."""
        out: dict[str, dict[int, set[str]]] = {}
        async for model, worker, raw in self._maps():
            for f in raw.values():
                out.setdefault(model, {}).setdefault(unpack_hash(f), set()).add(worker)
        return {m: {h: frozenset(w) for h, w in b.items()} for m, b in out.items()}

    async def export_snapshot(self) -> IndexSnapshot:
        """Every worker's mapping and event id, with the applied sequence (consistent when the
        caller is the only writer, i.e. the leading indexer between commits)."""
        seq = await self.applied_seq()
        workers: list[WorkerIndexSnapshot] = []
        async for model, worker, raw in self._maps():
            evid = await self.redis.hget(self.keys.evid(model), worker)
            workers.append(
                WorkerIndexSnapshot(
                    model, worker, int(evid or 0), b"".join(raw.keys()), b"".join(raw.values())
                )
            )
        return IndexSnapshot(seq=seq, ts_s=time.time(), workers=tuple(workers))

    async def import_snapshot(self, snap: IndexSnapshot) -> None:
        """Load a snapshot into an empty index (then replay the stream from ``snap.seq + 1``)."""
        items: list[ApplyItem] = []
        for w in snap.workers:
            engine, fleet = unpack_blob(w.engine_hashes), unpack_blob(w.fleet_hashes)
            items.append(
                (w.model, w.worker_id, w.event_id, 0, [StoreOp(w.worker_id, engine, fleet)])
            )
        await self.apply_many(items)
        await self.redis.hset(self.keys.pos, "seq", snap.seq)


_msgpack = msgspec.msgpack.Encoder()
_worker_id = attrgetter("worker_id")
_prefill = attrgetter("reported_prefill_blocks")
_decode = attrgetter("reported_decode_blocks")
_hint = attrgetter("hint_overlap_blocks")
_route_reply = msgspec.msgpack.Decoder(
    tuple[int, tuple[int, ...], tuple[float, ...], tuple[float, ...]]
)

_RESULTS = {
    ord("0"): ApplyResult(applied=False),
    ord("1"): ApplyResult(applied=True),
    ord("2"): ApplyResult(applied=True, gap=True),
}


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v
