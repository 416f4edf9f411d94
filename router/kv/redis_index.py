"""The shared prefix index in Redis (layout in ``keys``, scripts in ``lua``).

Every mutation is one Lua script carrying the stream sequence it applies, so the change and the
position are one atomic write: a redelivered batch (sequence <= applied) changes nothing, and an
indexer restart resumes at ``applied_seq() + 1``. ``apply_many`` pipelines many batches into one
round trip. A match and a routing decision are one script call each, whatever the prompt length
and the number of workers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from router.kv import lua
from router.kv.index import ApplyResult
from router.kv.keys import KvKeys, pack_hashes, unpack_blob, unpack_hash
from router.kv.routing import RouteCall, RouteOutcome
from router.kv.translate import ClearOp, IndexOp, StoreOp
from schemas.kv_events import IndexSnapshot, WorkerIndexSnapshot


def _op_args(ops: Sequence[IndexOp]) -> list[str | bytes]:
    args: list[str | bytes] = []
    for op in ops:
        if isinstance(op, ClearOp):
            args.append("C")
            continue
        args.append("S" if isinstance(op, StoreOp) else "R")
        args.append(pack_hashes(op.engine_hashes))
        args.append(pack_hashes(op.fleet_hashes))
    return args


class RedisPrefixIndex:
    def __init__(self, redis: Any, keys: KvKeys) -> None:
        self.redis = redis
        self.keys = keys
        self._apply = redis.register_script(lua.APPLY)
        self._drop = redis.register_script(lua.DROP_WORKER)
        self._match = redis.register_script(lua.MATCH)
        self._route = redis.register_script(lua.ROUTE)
        self._release = redis.register_script(lua.RELEASE)

    def _apply_args(
        self, model: str, worker_id: str, event_id: int, stream_seq: int, ops: Sequence[IndexOp]
    ) -> list[str | int | bytes]:
        return [self.keys.ns, model, worker_id, event_id, stream_seq, *_op_args(ops)]

    async def apply(
        self, model: str, worker_id: str, event_id: int, stream_seq: int, ops: Sequence[IndexOp]
    ) -> ApplyResult:
        applied, gap = await self._apply(
            keys=[], args=self._apply_args(model, worker_id, event_id, stream_seq, ops)
        )
        return ApplyResult(bool(applied), bool(gap))

    async def apply_many(
        self, items: Sequence[tuple[str, str, int, int, Sequence[IndexOp]]]
    ) -> list[ApplyResult]:
        """Pipeline several batches (model, worker, event id, stream seq, ops) in one round trip."""
        if not items:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for model, worker_id, event_id, seq, ops in items:
            await self._apply(
                keys=[], args=self._apply_args(model, worker_id, event_id, seq, ops), client=pipe
            )
        results = await pipe.execute()
        return [ApplyResult(bool(a), bool(g)) for a, g in results]

    async def match(self, model: str, block_hashes: Sequence[int]) -> dict[str, int]:
        flat = await self._match(keys=[], args=[self.keys.ns, model, pack_hashes(block_hashes)])
        return {_s(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}

    async def drop_worker(self, model: str, worker_id: str, stream_seq: int = 0) -> None:
        await self._drop(keys=[], args=[self.keys.ns, model, worker_id, stream_seq])

    async def applied_seq(self) -> int:
        v = await self.redis.hget(self.keys.pos, "seq")
        return int(v) if v else 0

    async def worker_mapping(self, model: str, worker_id: str) -> dict[int, int]:
        raw = await self.redis.hgetall(self.keys.map(model, worker_id))
        return {unpack_hash(e): unpack_hash(f) for e, f in raw.items()}

    async def workers(self, model: str) -> set[str]:
        with_slot = await self.redis.hkeys(self.keys.slot(model))
        with_evid = await self.redis.hkeys(self.keys.evid(model))
        return {_s(w) for w in (*with_slot, *with_evid)}

    async def route(self, call: RouteCall) -> RouteOutcome:
        cands = "".join(
            f"{c.worker_id}\t{c.reported_prefill_blocks:g}\t{c.reported_decode_blocks:g}"
            f"\t{c.hint_overlap_blocks}\n"
            for c in call.candidates
        )
        args: list[str | int | float | bytes] = [
            self.keys.ns,
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
        ]
        out = await self._route(keys=[], args=args)
        return RouteOutcome(
            winner=call.candidates[int(out[0]) - 1].worker_id,
            overlaps=tuple(map(int, _s(out[1]).split(","))),
            costs=tuple(map(float, _s(out[2]).split(","))),
            loads=tuple(map(float, _s(out[3]).split(","))),
        )

    async def release(self, request_id: str, prefill_only: bool = False) -> bool:
        part = "prefill" if prefill_only else "all"
        return bool(await self._release(keys=[], args=[self.keys.ns, request_id, part]))

    async def reserved(self, model: str, worker_id: str) -> tuple[int, int]:
        p, d = await self.redis.hmget(self.keys.load(model), f"{worker_id}:p", f"{worker_id}:d")
        return int(p or 0), int(d or 0)

    async def dump(self) -> dict[str, dict[int, frozenset[str]]]:
        """model -> block -> holders, rebuilt from the maps (for equality checks)."""
        out: dict[str, dict[int, set[str]]] = {}
        prefix = f"{self.keys.ns}:map:"
        async for key in self.redis.scan_iter(match=f"{prefix}*", count=1000):
            model, worker = _s(key)[len(prefix) :].rsplit(":", 1)
            for f in (await self.redis.hgetall(key)).values():
                out.setdefault(model, {}).setdefault(unpack_hash(f), set()).add(worker)
        return {m: {h: frozenset(w) for h, w in b.items()} for m, b in out.items()}

    async def export_snapshot(self) -> IndexSnapshot:
        """Every worker's mapping and event id, with the applied sequence (consistent when the
        caller is the only writer, i.e. the leading indexer between commits)."""
        seq = await self.applied_seq()
        workers: list[WorkerIndexSnapshot] = []
        prefix = f"{self.keys.ns}:map:"
        async for key in self.redis.scan_iter(match=f"{prefix}*", count=1000):
            model, worker = _s(key)[len(prefix) :].rsplit(":", 1)
            raw = await self.redis.hgetall(key)
            evid = await self.redis.hget(self.keys.evid(model), worker)
            workers.append(
                WorkerIndexSnapshot(
                    model, worker, int(evid or 0), b"".join(raw.keys()), b"".join(raw.values())
                )
            )
        return IndexSnapshot(seq=seq, ts_s=time.time(), workers=tuple(workers))

    async def import_snapshot(self, snap: IndexSnapshot) -> None:
        """Load a snapshot into an empty index (then replay the stream from ``snap.seq + 1``)."""
        items: list[tuple[str, str, int, int, Sequence[IndexOp]]] = []
        for w in snap.workers:
            engine, fleet = unpack_blob(w.engine_hashes), unpack_blob(w.fleet_hashes)
            items.append(
                (w.model, w.worker_id, w.event_id, 0, [StoreOp(w.worker_id, engine, fleet)])
            )
        await self.apply_many(items)
        await self.redis.hset(self.keys.pos, "seq", snap.seq)


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v
