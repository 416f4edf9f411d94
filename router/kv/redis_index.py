"""The shared prefix index in Redis (layout in ``keys``, scripts in ``lua``, shards in ``shards``).

Writes (the indexer): each batch's ops are cut by shard (a block goes to the shard its hash names,
a shallow one to every shard) and packed into ``APPLY`` calls of at most ``max_blocks_per_call``
block events, each carrying the shard's stream position for the indexer's group in the same
atomic write, so a redelivered batch (sequence <= applied) changes nothing on a shard that had it
and a restart resumes exactly. The calls of a group are pipelined per shard (one round trip) and
their results read later (``AppliedLater``), so Python prepares the next group while Redis
applies this one. Holders get their slots from the ``SlotBook``; a clear renews the slot, a
departure retires it: both one small call, whatever the holder held.

Reads (the routers): a route is one ``ROUTE`` call on the shard of the request's branch, whatever
the prompt's length and the fleet's size: the router's sample and hinted workers are scored, and
the pool's holders of the request's deepest blocks (``routing``), found with a bitmap of the
pool's slots built once per pool (``_encodings``) from the router's copy of the slot table.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import structlog
from redis.exceptions import NoScriptError, ResponseError

from router.kv import lua
from router.kv.index import ApplyResult
from router.kv.keys import pack_hashes
from router.kv.routing import RouteCall, RouteOutcome, Scored, WorkerPool
from router.kv.shard_clients import RedisShards
from router.kv.shards import route_shard, split_by_shard
from router.kv.slot_book import SlotBook
from router.kv.translate import ClearOp, IndexOp, RemoveOp, ShapeOp, StoreOp, holders

log = structlog.get_logger("jetfleet.kv.redis")

ApplyItem = tuple[str, str, int, int, Sequence[IndexOp]]  # model, worker, event id, seq, ops
Arg = str | int | float | bytes

# Block events one APPLY call carries at most: ~0.3-0.5 ms of Redis here, so a route queued
# behind one waits no longer than that.
MAX_BLOCKS_PER_CALL = 256


@dataclass
class _Entry:
    model: str
    seq: int
    worker: str
    event_id: int
    ops: list[tuple[str, int, bytes | int, int]] = field(default_factory=list)  # op, slot, arg, n


@dataclass
class _RouterTable:
    version: int
    slots: dict[str, int]


class AppliedLater:
    """The results of started apply calls: one per batch, in order."""

    def __init__(self, results: list[ApplyResult], waits: Sequence[Any] = ()) -> None:
        self._results = results
        self._waits = waits

    def known(self) -> list[ApplyResult]:
        """The results as known when the calls were written (whether each batch applies, and
        its event id gap), before their replies."""
        return self._results

    async def results(self) -> list[ApplyResult]:
        for wait in self._waits:
            await wait
        return self._results


@functools.cache
def _sha(src: str) -> str:
    """A script's SHA1 (EVALSHA's name for it); the sources are the module's constants."""
    return hashlib.sha1(src.encode()).hexdigest()


class RedisPrefixIndex:
    def __init__(
        self,
        redis: Any,
        ns: str,
        n_shards: int = 0,
        max_blocks_per_call: int = MAX_BLOCKS_PER_CALL,
        lean: bool = True,
        group: int = 0,
        writer: bool = False,
    ) -> None:
        """``ns``: the namespace (``keys.namespace``); ``n_shards`` 0: as recorded (a writer
        records its default when nothing is); ``lean``: script calls on a ``RespPipe`` to each
        shard's server when the client is a plain TCP / unix-socket one; ``group``: the indexer
        group whose stream position its writes carry; ``writer``: an indexer (it may record the
        shard count)."""
        self.redis = redis
        self.ns = ns
        self.shards = RedisShards(redis, ns, n_shards, lean)
        self.book = SlotBook(self.shards, self._script)
        self.max_blocks_per_call = max_blocks_per_call
        self.group = group
        self.writer = writer
        self._evid: dict[tuple[str, str], int] = {}
        self._pos: list[int] | None = None
        self._routed: dict[str, int] = {}  # request id -> the shard it was routed on
        self._tables: dict[str, _RouterTable] = {}
        self._enc: dict[tuple[str, int], tuple[int, bytes, bytes]] = {}
        self._refreshing: dict[str, asyncio.Task[None]] = {}

    # ------------------------------------------------------------------ plumbing
    async def ready(self) -> RedisShards:
        if not self.shards.ready:
            await self.shards.resolve(record=self.writer)
        return self.shards

    async def _script(self, shard: int, src: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """One script call on a shard (EVALSHA; loaded on that shard's server on first use and
        after a restart; a slot that moved is looked up again)."""
        await self.ready()
        for attempt in range(3):
            s = self.shards[shard]
            cmd = ("EVALSHA", _sha(src), len(keys), *keys, *args)
            try:
                if s.pipe is not None:
                    return await s.pipe.call(*cmd)
                return await s.redis.execute_command(*cmd)
            except NoScriptError:
                await s.redis.script_load(src)
            except ResponseError as exc:
                if not str(exc).startswith(("MOVED", "ASK")) or attempt == 2:
                    raise
                await self.shards.refresh()
        raise RuntimeError("unreachable")

    def reset(self) -> None:
        """Forget what this process cached of the index (after Redis was lost)."""
        self._evid.clear()
        self._pos = None
        self.book = SlotBook(self.shards, self._script)
        self._tables.clear()
        self._enc.clear()

    async def warm(self) -> None:
        """Load the routing scripts and open the lean connections before the first request, so
        a burst at start-up does not pay for it (measured: 20-50 ms on each of the first 16
        routes of a cold frontend otherwise, every one of them loading the scripts itself)."""
        shards = await self.ready()
        for s in shards.shards:
            for src in (lua.ROUTE, lua.RELEASE, lua.MATCH):
                await s.redis.script_load(src)
            if s.pipe is not None:
                await s.pipe.call("PING")

    async def aclose(self) -> None:
        await self.shards.aclose()

    # ------------------------------------------------------------------ writes
    async def apply(
        self, model: str, worker_id: str, event_id: int, stream_seq: int, ops: Sequence[IndexOp]
    ) -> ApplyResult:
        (res,) = await self.apply_many([(model, worker_id, event_id, stream_seq, ops)])
        await self.book.sync(force=True)
        return res

    async def apply_many(self, items: Sequence[ApplyItem]) -> list[ApplyResult]:
        """Apply batches (model, worker, event id, stream seq, ops) in stream order."""
        return await (await self.start_apply(items)).results()

    async def _positions(self) -> list[int]:
        if self._pos is None:
            shards = await self.ready()
            self._pos = [
                int(await s.call("HGET", s.keys.pos, str(self.group)) or 0) for s in shards.shards
            ]
        return self._pos

    async def applied_seq(self) -> int:
        """Highest stream sequence applied on every shard, for this index's group."""
        shards = await self.ready()
        got = [int(await s.call("HGET", s.keys.pos, str(self.group)) or 0) for s in shards.shards]
        return min(got)

    async def _last_event_id(self, model: str, worker: str) -> int:
        key = (model, worker)
        found = self._evid.get(key)
        if found is None:
            shards = await self.ready()
            ids = [await s.call("HGET", s.keys.evid(model), worker) for s in shards.shards]
            found = self._evid[key] = max((int(i) for i in ids if i), default=0)
        return found

    async def start_apply(self, items: Sequence[ApplyItem]) -> AppliedLater:
        """Write the batches now and read their results later (``AppliedLater.results``), so the
        caller can prepare and write the next ones meanwhile: calls on one shard's connection are
        executed in the order they were started.

        Apply calls use EVAL with the script body, not EVALSHA: Redis caches the compiled script
        by its SHA1 anyway, and a Redis restart cannot fail a call with NOSCRIPT, whose retry
        could land after calls written behind it and lose its batches."""
        if not items:
            return AppliedLater([])
        shards = await self.ready()
        n = shards.n
        pos = await self._positions()
        low = min(pos)
        results: list[ApplyResult] = []
        per_shard: list[list[_Entry]] = [[] for _ in range(n)]
        top = 0
        for model, worker, event_id, seq, ops in items:
            if seq and seq <= low:
                results.append(ApplyResult(applied=False))
                continue
            gap = False
            if worker:
                last = await self._last_event_id(model, worker)
                gap = last != 0 and event_id > last + 1
                if event_id > last:
                    self._evid[(model, worker)] = event_id
            entries = [_Entry(model, seq, worker, event_id) for _ in range(n)]
            await self._cut(model, seq, ops, entries)
            for s, entry in enumerate(entries):
                if entry.ops:
                    per_shard[s].append(entry)
            if worker and not any(e.ops for e in entries):  # its event id, at least
                per_shard[0].append(entries[0])
            top = max(top, seq)
            results.append(ApplyResult(applied=True, gap=gap))
        waits = []
        for s in range(n):
            entries = per_shard[s]
            if top > pos[s] and (not entries or entries[-1].seq != top):
                entries.append(_Entry("", top, "", 0))  # the position alone
            if top > pos[s]:
                pos[s] = top
            calls = self._calls(s, entries)
            if calls:
                waits.append(self._send(s, calls))
        started = [asyncio.ensure_future(w) for w in waits]
        await self.book.sync()
        return AppliedLater(results, started)

    async def _cut(
        self, model: str, seq: int, ops: Sequence[IndexOp], entries: list[_Entry]
    ) -> None:
        """A batch's ops, each on the shards its blocks live on, with the holders' slots."""
        n = len(entries)
        for op in ops:
            hid = op.worker_id
            if isinstance(op, ClearOp):
                await self.book.renew(model, hid, seq)
                continue
            (slot,) = await self.book.slots_of(model, [hid])
            if isinstance(op, ShapeOp):
                for e in entries:
                    e.ops.append(("H", slot, 1 if op.hole_free else 0, 0))
                continue
            kind = "S" if isinstance(op, StoreOp) else "R"
            assert isinstance(op, StoreOp | RemoveOp)
            for s, hashes in split_by_shard(op.hashes, n).items():
                entries[s].ops.append((kind, slot, pack_hashes(hashes), len(hashes)))

    def _calls(self, shard: int, entries: list[_Entry]) -> list[tuple[Arg, ...]]:
        """APPLY calls of at most ``max_blocks_per_call`` block events each; an entry too big for
        one is cut into pieces, all but the last without its sequence (always applied)."""
        keys = self.shards[shard].keys
        budget = self.max_blocks_per_call
        calls: list[tuple[Arg, ...]] = []
        models: dict[str, int] = {}
        body: list[Arg] = []
        used = 0

        def flush() -> None:
            nonlocal body, used
            if not body:
                return
            kl: list[str] = [keys.pos]
            for m in models:
                kl += (keys.blocks(m), keys.nohole(m), keys.evid(m))
            argv: list[Arg] = [str(self.group), len(models), *models, *body]
            calls.append(("EVAL", lua.APPLY, len(kl), *kl, *argv))
            models.clear()
            body, used = [], 0

        for entry in entries:
            ops = _split_ops(entry.ops, budget)
            while True:
                room = budget - used
                take: list[tuple[str, int, bytes | int, int]] = []
                size = 0
                while ops and (size + ops[0][3] <= room or (not take and used == 0)):
                    op = ops.pop(0)
                    take.append(op)
                    size += op[3]
                last = not ops
                mi = models.setdefault(entry.model, len(models) + 1) if entry.model else 1
                body += (
                    mi,
                    entry.seq if last else 0,
                    entry.worker if last else "",
                    entry.event_id,
                    len(take),
                )
                for kind, slot, arg, _ in take:
                    body += (kind, slot, arg)
                used += size
                if used >= budget:
                    flush()
                if last:
                    break
                flush()
        flush()
        return calls

    async def _send(self, shard: int, calls: list[tuple[Arg, ...]]) -> list[Any]:
        s = self.shards[shard]
        if s.pipe is not None:
            return await s.pipe.call_many(calls)
        pipe = s.redis.pipeline(transaction=False)
        for c in calls:
            pipe.execute_command(*c)
        out: list[Any] = await pipe.execute()
        return out

    async def drop_worker(self, model: str, worker_id: str) -> None:
        """The worker left (or had a gap): its holders' slots are retired, O(1) whatever they
        held; the sweeper clears their bits later."""
        await self.ready()
        table = self.book.slots.get(model)
        if table is None:
            table = await self.book.load(model)
        await self.book.retire(model, [h for h in holders(worker_id) if h in table])
        self._evid.pop((model, worker_id), None)
        for s in self.shards.shards:
            await s.call("HDEL", s.keys.evid(model), worker_id)
        await self.book.sync(force=True)

    async def sweep(self, model: str) -> int:
        return await self.book.sweep(model)

    async def workers(self, model: str) -> set[str]:
        """Holders with a slot, and workers with a recorded event id."""
        shards = await self.ready()
        found = set(await self.book.load(model))
        for s in shards.shards:
            found |= {_s(w) for w in await s.redis.hkeys(s.keys.evid(model))}
        return found

    async def models(self) -> set[str]:
        """Models with a slot table."""
        shards = await self.ready()
        s0 = shards[0]
        prefix = s0.keys.slot("")
        out = set()
        async for key in s0.redis.scan_iter(match=f"{_glob(prefix)}*", count=1000):
            out.add(_s(key)[len(prefix) :])
        return out

    async def dump(self) -> dict[str, dict[int, frozenset[str]]]:
        """model -> block -> holders, from every shard's bitmaps and the slot tables (equality
        checks in tests; reads the whole index)."""
        shards = await self.ready()
        out: dict[str, dict[int, set[str]]] = {}
        for model in await self.models():
            table = await self.book.load(model)
            by_slot = {s: h for h, s in table.items()}
            blocks = out.setdefault(model, {})
            for s in shards.shards:
                raw = await s.redis.hgetall(s.keys.blocks(model))
                for block, bitmap in raw.items():
                    held = {
                        by_slot[8 * i + b]
                        for i, byte in enumerate(bitmap)
                        for b in range(8)
                        if byte & (0x80 >> b) and 8 * i + b in by_slot
                    }
                    if held:
                        blocks.setdefault(int.from_bytes(block, "big"), set()).update(held)
        return {m: {h: frozenset(w) for h, w in b.items()} for m, b in out.items() if b}

    async def held_blocks(self, model: str, holder: str) -> int:
        """How many blocks a holder holds (diagnostics: reads the whole index)."""
        blocks = (await self.dump()).get(model, {})
        return sum(1 for holders in blocks.values() if holder in holders)

    # ------------------------------------------------------------------ reads
    async def match(self, model: str, block_hashes: Sequence[int]) -> dict[str, int]:
        shards = await self.ready()
        s = shards[route_shard(block_hashes, shards.n)]
        k = s.keys
        keys = [k.blocks(model), k.nohole(model), k.slotw(model)]
        flat = await self._script(s.index, lua.MATCH, keys, (pack_hashes(block_hashes),))
        return {_s(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}

    async def route(self, call: RouteCall) -> RouteOutcome:
        shards = await self.ready()
        s = route_shard(call.block_hashes, shards.n)
        k = shards[s].keys
        m = call.model
        explicit = call.explicit()
        loads = [call.pool.load_of(w) for w in explicit]
        cands = _msgpack.encode(
            (
                explicit,
                [p for p, _ in loads],
                [d for _, d in loads],
                [call.hints.get(w, 0) for w in explicit],
            )
        )
        version, elig, rep = b"0", b"", b""
        if len(call.pool.workers) > len(explicit) and call.max_holders > 0:
            version, elig, rep = self._encodings(m, call.pool)
        previous = self._routed.get(call.request_id)
        if call.request_id and previous is not None and previous != s:
            await self._release_on(previous, call.request_id, False)
        keys = [
            k.blocks(m),
            k.nohole(m),
            k.slot(m),
            k.slotw(m),
            k.slotver(m),
            k.load_prefill(m),
            k.load_decode(m),
            k.rexp,
        ]
        out = await self._script(
            s,
            lua.ROUTE,
            keys,
            (
                k.base,
                m,
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
                version,
                elig,
                rep,
                call.max_holders,
            ),
        )
        winner, seen_version, ids, overlaps, costs, route_loads = _route_reply.decode(out)
        if winner == 0:
            raise ValueError("a route needs at least one candidate")
        if call.request_id:
            self._routed[call.request_id] = s
        table = self._tables.get(m)
        if len(call.pool.workers) > len(explicit) and (
            table is None or table.version != seen_version
        ):
            self._refresh_table(m)
        scored = tuple(
            Scored(w, ov, ld, c)
            for w, ov, c, ld in zip(ids, overlaps, costs, route_loads, strict=True)
        )
        return RouteOutcome(ids[winner - 1], scored)

    def prepare(self, model: str, pool: WorkerPool) -> None:
        """Build a pool's encodings now (its router read it again off the request path)."""
        if model in self._tables:
            self._encodings(model, pool)

    def _encodings(self, model: str, pool: WorkerPool) -> tuple[bytes, bytes, bytes]:
        """(slot table version, eligibility bitmap, reported loads by slot) of a pool, built once
        per pool and table; nothing until this router has read the table (then only the
        explicit candidates are scored)."""
        table = self._tables.get(model)
        if table is None:
            self._refresh_table(model)
            return b"0", b"", b""
        key = (model, pool.key)
        found = self._enc.get(key)
        if found is not None and found[0] == table.version:
            return str(table.version).encode(), found[1], found[2]
        slots = [(table.slots[w], w) for w in pool.workers if w in table.slots]
        top = max((s for s, _ in slots), default=-1)
        bits = bytearray((top + 8) // 8)
        rep = bytearray(8 * (top + 1))
        for slot, w in slots:
            bits[slot // 8] |= 0x80 >> (slot % 8)
            p, d = pool.load_of(w)
            _PAIR.pack_into(rep, 8 * slot, p, d)
        if len(self._enc) > 64:
            self._enc.clear()
        self._enc[key] = (table.version, bytes(bits), bytes(rep))
        return str(table.version).encode(), bytes(bits), bytes(rep)

    def _refresh_table(self, model: str) -> None:
        task = self._refreshing.get(model)
        if task is not None and not task.done():
            return

        async def load() -> None:
            with contextlib.suppress(Exception):  # the next route asks again
                k = self.shards[0].keys
                raw = await self.shards[0].hgetall(k.slot(model))
                ver = int(await self.shards[0].call("GET", k.slotver(model)) or 0)
                slots = {_s(h): int(v) for h, v in raw.items() if b" " not in h and h != b"~tiers"}
                self._tables[model] = _RouterTable(ver, slots)

        self._refreshing[model] = asyncio.create_task(load())

    async def load_table(self, model: str) -> None:
        """Read the slot table now (a router that must use its pool at once, e.g. in tests)."""
        await self.ready()
        self._refresh_table(model)
        await self._refreshing[model]

    async def release(self, request_id: str, prefill_only: bool = False) -> bool:
        shard = self._routed.get(request_id)
        if shard is None:
            return False
        if not prefill_only:
            del self._routed[request_id]
        return await self._release_on(shard, request_id, prefill_only)

    async def _release_on(self, shard: int, request_id: str, prefill_only: bool) -> bool:
        k = self.shards[shard].keys
        part = "prefill" if prefill_only else "all"
        keys = [k.reservation(request_id), k.rexp]
        return bool(await self._script(shard, lua.RELEASE, keys, (k.base, request_id, part)))

    async def reserved(self, model: str, worker_id: str) -> tuple[int, int]:
        shards = await self.ready()
        p = d = 0
        for s in shards.shards:
            p += int(await s.redis.hget(s.keys.load_prefill(model), worker_id) or 0)
            d += int(await s.redis.hget(s.keys.load_decode(model), worker_id) or 0)
        return p, d


def _split_ops(
    ops: list[tuple[str, int, bytes | int, int]], budget: int
) -> list[tuple[str, int, bytes | int, int]]:
    """Ops whose blobs are cut to at most ``budget`` blocks each (a long stored run)."""
    out: list[tuple[str, int, bytes | int, int]] = []
    for kind, slot, arg, n in ops:
        if n <= budget or not isinstance(arg, bytes):
            out.append((kind, slot, arg, n))
            continue
        for lo in range(0, n, budget):
            piece = arg[8 * lo : 8 * min(lo + budget, n)]
            out.append((kind, slot, piece, len(piece) // 8))
    return out


def _glob(text: str) -> str:
    """``text`` as a literal SCAN pattern (the shard tag's braces are not special; ``[``, ``*``,
    ``?`` would be)."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


_msgpack = msgspec.msgpack.Encoder()
_route_reply = msgspec.msgpack.Decoder(
    tuple[int, int, tuple[str, ...], tuple[int, ...], tuple[float, ...], tuple[float, ...]]
)


_PAIR = struct.Struct(">ff")  # a slot's reported prefill and decode blocks


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v
