"""The prefix index interface, and the in-memory implementation.

The index answers one question fast: for a request's chain of block hashes, how many leading
blocks does each worker hold? It is fed ``IndexOp``s (see ``translate``) tagged with the stream
sequence they came from, and remembers the highest sequence applied and each worker's last event
id in the same step as the change, so a redelivered batch changes nothing and a restart resumes
exactly.

Blocks are kept per model: ``blocks[model][fleet_hash] = {holders}``. A match walks the chain
and keeps only the holders still matching, stopping when none are left.

``InMemoryPrefixIndex`` serves unit tests, the routers' own recent routes and one-process runs;
``RedisPrefixIndex`` (module ``redis_index``) is the shared one. The contract suite in
``tests/support/kv_contract.py`` runs unchanged against both (the Redis one also bisects the
chains of holders whose cached blocks are prefix-closed; this one always walks them, which is
what the contract checks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from router.kv.routing import (
    RouteCall,
    RouteOutcome,
    Scored,
    WorkerPool,
    deepest_holders,
    pick,
    route_cost,
)
from router.kv.translate import ClearOp, IndexOp, RemoveOp, StoreOp, holders


@dataclass(frozen=True, slots=True)
class ApplyResult:
    applied: bool  # False: this stream sequence was applied before (redelivery)
    gap: bool = False  # the worker's event id jumped: entries before it may be missing


class PrefixIndex(Protocol):
    async def apply(
        self, model: str, worker_id: str, event_id: int, stream_seq: int, ops: Sequence[IndexOp]
    ) -> ApplyResult:
        """Apply one batch's ops atomically with its stream sequence and worker event id."""

    async def match(self, model: str, block_hashes: Sequence[int]) -> dict[str, int]:
        """Holder -> number of leading blocks of ``block_hashes`` it holds (> 0 only)."""

    async def drop_worker(self, model: str, worker_id: str) -> None:
        """Forget every block of a worker and its tiers (it left discovery, or had a gap)."""

    async def applied_seq(self) -> int:
        """Highest stream sequence applied (0: none)."""

    async def workers(self, model: str) -> set[str]:
        """Holders with at least one block or a slot."""

    async def route(self, call: RouteCall) -> RouteOutcome:
        """Match, score, pick and reserve in one atomic step (see ``routing``)."""

    async def release(self, request_id: str, prefill_only: bool = False) -> bool:
        """Release a reservation (or only its prefill part); False if there was none."""

    async def reserved(self, model: str, worker_id: str) -> tuple[int, int]:
        """(prefill, decode) blocks reserved on a worker right now."""

    async def warm(self) -> None:
        """Be ready for the first routing call (open connections, load scripts)."""

    def prepare(self, model: str, pool: WorkerPool) -> None:
        """Build now whatever the index keeps of a pool (not on a request's path)."""


@dataclass
class _Reservation:
    model: str
    worker_id: str
    prefill: int
    decode: int
    expires_ms: int


class InMemoryPrefixIndex:
    def __init__(self) -> None:
        self._blocks: dict[str, dict[int, set[str]]] = {}
        self._held: dict[tuple[str, str], set[int]] = {}  # (model, holder) -> its blocks
        self._event_ids: dict[tuple[str, str], int] = {}
        self._seq = 0
        self._res: dict[str, _Reservation] = {}
        self._load: dict[tuple[str, str], list[int]] = {}

    async def apply(
        self, model: str, worker_id: str, event_id: int, stream_seq: int, ops: Sequence[IndexOp]
    ) -> ApplyResult:
        if stream_seq and stream_seq <= self._seq:
            return ApplyResult(applied=False)
        key = (model, worker_id)
        last = self._event_ids.get(key, 0)
        gap = last != 0 and event_id > last + 1
        blocks = self._blocks.setdefault(model, {})
        for op in ops:  # an op's holder: the worker or one of its lower tiers
            hid = op.worker_id
            if isinstance(op, StoreOp):
                held = self._held.setdefault((model, hid), set())
                for h in op.hashes:
                    held.add(h)
                    blocks.setdefault(h, set()).add(hid)
            elif isinstance(op, RemoveOp):
                held = self._held.setdefault((model, hid), set())
                for h in op.hashes:
                    held.discard(h)
                    self._discard(blocks, h, hid)
            elif isinstance(op, ClearOp):
                self._clear(model, hid)
            # ShapeOp: this index always walks chains block by block
        if worker_id:
            self._event_ids[key] = max(event_id, last)
        if stream_seq:
            self._seq = stream_seq
        return ApplyResult(applied=True, gap=gap)

    @staticmethod
    def _discard(blocks: dict[int, set[str]], h: int, holder: str) -> None:
        found = blocks.get(h)
        if found is not None:
            found.discard(holder)
            if not found:
                del blocks[h]

    def _clear(self, model: str, holder: str) -> None:
        blocks = self._blocks.get(model, {})
        for h in self._held.pop((model, holder), set()):
            self._discard(blocks, h, holder)

    async def match(self, model: str, block_hashes: Sequence[int]) -> dict[str, int]:
        blocks = self._blocks.get(model, {})
        result: dict[str, int] = {}
        active: set[str] | None = None
        for i, h in enumerate(block_hashes):
            found = blocks.get(h)
            if not found:
                break
            active = set(found) if active is None else active & found
            if not active:
                break
            for w in active:
                result[w] = i + 1
        return result

    async def drop_worker(self, model: str, worker_id: str) -> None:
        for hid in holders(worker_id):
            self._clear(model, hid)
        self._event_ids.pop((model, worker_id), None)

    async def applied_seq(self) -> int:
        return self._seq

    async def workers(self, model: str) -> set[str]:
        return {w for (m, w) in self._event_ids if m == model} | {
            w for (m, w), held in self._held.items() if m == model and held
        }

    async def route(self, call: RouteCall) -> RouteOutcome:
        self._expire(call.now_ms)
        overlap = await self.match(call.model, call.block_hashes)
        explicit = call.explicit()
        chosen = [(w, overlap.get(w, 0)) for w in explicit]
        for w, ov in deepest_holders(overlap, call.pool.workers, set(explicit), call.max_holders):
            chosen.append((w, ov))
        blocks = self._blocks.get(call.model, {})
        scored: list[Scored] = []
        for w, ov in chosen:
            p, d = self._load.get((call.model, w), [0, 0])
            rp, rd = call.pool.load_of(w)
            ap, ad = max(p, rp), max(d, rd)
            if call.host_weight > 0:
                ov = _with_tiers(blocks, call.block_hashes, w, ov, call.host_weight)
            ov = max(ov, call.hints.get(w, 0))
            cost = route_cost(
                call.prefill_weight, ap, ad, call.new_blocks, ov, call.prefill_overhead_blocks
            )
            scored.append(Scored(w, ov, ap + ad, cost))
        if not scored:
            raise ValueError("a route needs at least one candidate")
        i = pick([s.cost for s in scored], call.temperature, call.rand)
        winner = scored[i]
        if call.request_id:
            await self.release(call.request_id)
            res = _Reservation(
                call.model,
                winner.worker_id,
                max(call.new_blocks - winner.overlap_blocks, 0) + call.prefill_overhead_blocks,
                call.new_blocks,
                call.now_ms + call.ttl_ms,
            )
            self._res[call.request_id] = res
            acc = self._load.setdefault((call.model, winner.worker_id), [0, 0])
            acc[0] += res.prefill
            acc[1] += res.decode
        return RouteOutcome(winner.worker_id, tuple(scored))

    async def release(self, request_id: str, prefill_only: bool = False) -> bool:
        res = self._res.get(request_id)
        if res is None:
            return False
        acc = self._load.setdefault((res.model, res.worker_id), [0, 0])
        acc[0] -= res.prefill
        res.prefill = 0
        if not prefill_only:
            acc[1] -= res.decode
            del self._res[request_id]
        return True

    async def warm(self) -> None:
        return None  # nothing to open

    def prepare(self, model: str, pool: WorkerPool) -> None:
        return None  # keeps nothing of it

    async def reserved(self, model: str, worker_id: str) -> tuple[int, int]:
        p, d = self._load.get((model, worker_id), [0, 0])
        return p, d

    def _expire(self, now_ms: int) -> None:
        for rid in [r for r, v in self._res.items() if v.expires_ms <= now_ms]:
            res = self._res.pop(rid)
            acc = self._load[(res.model, res.worker_id)]
            acc[0] -= res.prefill
            acc[1] -= res.decode

    def dump(self) -> dict[str, dict[int, frozenset[str]]]:
        """Every model's block -> holders (for equality checks in tests and replay)."""
        return {
            m: {h: frozenset(ws) for h, ws in blocks.items() if ws}
            for m, blocks in self._blocks.items()
        }


def _with_tiers(
    blocks: dict[int, set[str]], hashes: Sequence[int], worker_id: str, g: int, weight: float
) -> int:
    """The GPU prefix ``g`` continued through blocks held by any of the worker's holders, the
    continuation counted at ``weight`` (the rule of ``routing``; the Lua route mirrors it)."""
    tiers = set(holders(worker_id))
    t = g
    while t < len(hashes) and not tiers.isdisjoint(blocks.get(hashes[t], ())):
        t += 1
    return g + math.floor(weight * (t - g))
