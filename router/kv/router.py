"""KV-aware routers: ``kv`` (prefix index fed by KV events) and ``approx`` (routing history).

``kv`` — one Redis round trip per request (``PrefixIndex.route``): the request's chained block
hashes are matched against every candidate, each candidate is scored with

    cost = prefill_weight * max(active_prefill_blocks + new_blocks - overlap_blocks, 0)
           + active_decode_blocks + new_blocks

and the lowest cost wins (ties at random; with ``temperature > 0`` a softmax sample over
``-cost / temperature``). ``active_*`` is the larger of the reservations every router holds on the
worker (Redis, visible to all frontends) and the worker's own last ``WorkerLoad`` report
(``active_prefill_tokens / block_size``, ``active_decode_blocks``). The winner's predicted load is
reserved in the same step; the prefill part is released at the first token, the rest when the
request ends, and a reservation whose router died expires after ``reservation_ttl_s``.

Settings: ``prefill_weight`` (default 1.0; higher favours cache hits over balance),
``temperature`` (default 0: deterministic lowest cost), ``reservation_ttl_s`` (default 120).

``approx`` — for fleets whose engines publish no KV events: the same cost, but the overlap comes
from an in-process index of where this router sent each prefix in the last ``approx_ttl_s``
seconds (assumed cached there), and the load from this router's own in-flight count.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from router.fleet_state import WorkerView
from router.kv.index import InMemoryPrefixIndex, PrefixIndex
from router.kv.routing import CandidateLoad, RouteCall
from router.kv.translate import RemoveOp, StoreOp, fleet_hashes_for_prompt
from router.policies import RouteQuery
from schemas import RouteCandidate, RouteDecision


@dataclass(frozen=True)
class KvRouterConfig:
    prefill_weight: float = 1.0
    temperature: float = 0.0
    reservation_ttl_s: float = 120.0
    approx_ttl_s: float = 120.0
    load_report_max_age_s: float = 5.0  # older reports are ignored


def _blocks(n_tokens: int, block_size: int) -> int:
    return -(-n_tokens // block_size)


class KvRouter:
    name = "kv"

    def __init__(
        self, index: PrefixIndex, cfg: KvRouterConfig | None = None, seed: int | None = None
    ) -> None:
        self.index = index
        self.cfg = cfg or KvRouterConfig()
        self._rng = random.Random(seed)

    def _candidate(self, v: WorkerView, block_size: int, now: float) -> CandidateLoad:
        load = v.load
        if load is None or now - v.load_at > self.cfg.load_report_max_age_s:
            return CandidateLoad(v.worker_id)
        return CandidateLoad(
            v.worker_id,
            reported_prefill_blocks=load.active_prefill_tokens / block_size,
            reported_decode_blocks=float(load.active_decode_blocks),
        )

    async def route(self, query: RouteQuery, candidates: Sequence[WorkerView]) -> RouteDecision:
        t0 = time.perf_counter()
        block_size = candidates[0].reg.block_size
        hashes = tuple(fleet_hashes_for_prompt(query.token_ids, block_size, query.lora_name))
        now = time.monotonic()
        call = RouteCall(
            model=query.model,
            request_id=query.request_id,
            block_hashes=hashes,
            new_blocks=_blocks(query.num_prompt_tokens, block_size),
            candidates=tuple(self._candidate(v, block_size, now) for v in candidates),
            prefill_weight=self.cfg.prefill_weight,
            temperature=self.cfg.temperature,
            rand=self._rng.random(),
            now_ms=int(time.time() * 1000),
            ttl_ms=int(self.cfg.reservation_ttl_s * 1000),
        )
        out = await self.index.route(call)
        cands = tuple(
            RouteCandidate(c.worker_id, ov, load, cost)
            for c, ov, load, cost in zip(
                call.candidates, out.overlaps, out.loads, out.costs, strict=True
            )
        )
        return RouteDecision(
            self.name, out.winner, cands, decision_us=(time.perf_counter() - t0) * 1e6
        )

    async def first_token(self, request_id: str) -> None:
        await self.index.release(request_id, prefill_only=True)

    async def finished(self, request_id: str) -> None:
        await self.index.release(request_id)


class ApproxKvRouter:
    """Prefix affinity from routing history, for engines without KV events (in-process)."""

    name = "approx"

    def __init__(self, cfg: KvRouterConfig | None = None, seed: int | None = None) -> None:
        self.cfg = cfg or KvRouterConfig()
        self._rng = random.Random(seed)
        self._index = InMemoryPrefixIndex()
        self._history: deque[tuple[float, str, str, tuple[int, ...]]] = deque()
        self._event_ids: dict[str, int] = {}

    async def _forget_old(self, now: float) -> None:
        while self._history and now - self._history[0][0] > self.cfg.approx_ttl_s:
            _, model, worker, hashes = self._history.popleft()
            await self._apply(model, worker, RemoveOp(worker, hashes, hashes))

    async def _apply(self, model: str, worker: str, op: StoreOp | RemoveOp) -> None:
        eid = self._event_ids.get(worker, 0) + 1
        self._event_ids[worker] = eid
        await self._index.apply(model, worker, eid, 0, [op])

    async def route(self, query: RouteQuery, candidates: Sequence[WorkerView]) -> RouteDecision:
        t0 = time.perf_counter()
        now = time.monotonic()
        await self._forget_old(now)
        block_size = candidates[0].reg.block_size
        hashes = tuple(fleet_hashes_for_prompt(query.token_ids, block_size, query.lora_name))
        call = RouteCall(
            model=query.model,
            request_id="",
            block_hashes=hashes,
            new_blocks=_blocks(query.num_prompt_tokens, block_size),
            candidates=tuple(
                CandidateLoad(v.worker_id, reported_decode_blocks=float(v.in_flight * 8))
                for v in candidates
            ),
            prefill_weight=self.cfg.prefill_weight,
            temperature=self.cfg.temperature,
            rand=self._rng.random(),
        )
        out = await self._index.route(call)
        if hashes:
            await self._apply(query.model, out.winner, StoreOp(out.winner, hashes, hashes))
            self._history.append((now, query.model, out.winner, hashes))
        cands = tuple(
            RouteCandidate(c.worker_id, ov, load, cost)
            for c, ov, load, cost in zip(
                call.candidates, out.overlaps, out.loads, out.costs, strict=True
            )
        )
        return RouteDecision(
            self.name, out.winner, cands, decision_us=(time.perf_counter() - t0) * 1e6
        )

    async def first_token(self, request_id: str) -> None:
        return None

    async def finished(self, request_id: str) -> None:
        return None
