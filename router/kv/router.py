"""KV-aware routers: ``kv`` (prefix index fed by KV events) and ``approx`` (routing history).

``kv`` — one Redis round trip per request (``PrefixIndex.route``), on the shard of the request's
branch. Scored are: up to ``sample`` workers of the candidate pool (all of them in a fleet that
small; else half the least loaded as last reported and half at random, "the power of choices"),
the workers this router's recent routes hint at, and the holders of the request's deepest cached
blocks (up to ``max_holders``, found by the index); each with

    cost = prefill_weight * (max(active_prefill_blocks + new_blocks - overlap_blocks, 0)
                             + prefill_overhead_blocks)
           + active_decode_blocks + new_blocks

So a route costs the same with 16 workers and with 1,024, and the decision an observation
carries holds the ``OBSERVED_CANDIDATES`` best, not the fleet. The lowest cost wins (ties at
random; with ``temperature > 0`` a softmax sample over ``-cost / temperature`` among the
candidates within ``SOFTMAX_CUTOFF`` temperatures of the best); the rule itself is
``router/kv/routing.py: route_cost``, which the Lua ``route`` script mirrors. ``active_*`` is
the larger of the reservations every router holds on the worker (Redis, visible to all
frontends) and the worker's own last ``WorkerLoad`` report (``active_prefill_tokens /
block_size``, ``active_decode_blocks``). The winner's predicted load is reserved in the same step;
the prefill part is released at the first token, the rest when the request ends, and a
reservation whose router died expires after ``reservation_ttl_s``.

Settings: ``prefill_weight`` (default 8: a block that must be prefilled costs 8 times a block
held for decode; a cache miss costs a whole prefill and evicts other prefixes, an extra request
in a decode batch costs little), ``prefill_overhead_blocks`` (default 4: what each queued prefill
costs beyond its tokens; see ``routing``), ``temperature`` (default 8 blocks: near-equal
candidates share the load, clear winners keep it; 0 = always the lowest cost),
``reservation_ttl_s`` (default 120), ``hint_ttl_s`` (default 5). The defaults come from a sweep in
simulated time (``tests/bench/routing_sim.py --sweep``) confirmed live on the routing-quality
benchmark (docs/benchmarks.md, "Measurements behind design choices").

While Redis is unreachable (an outage, a Sentinel failover: ``redis_fallback``, on by default),
``kv`` keeps routing with the same cost over what this router knows alone (its routes of the last
``hint_ttl_s`` as the overlap, the workers' reported load and its own in-memory reservations),
as policy ``kv-fallback`` in the decision; the first route that reaches Redis again ends it.

``approx`` — for fleets whose engines publish no KV events: the same cost, but the overlap comes
from an in-process index of where this router sent each prefix in the last ``approx_ttl_s``
seconds (assumed cached there), and the load from this router's own in-flight count.
"""

from __future__ import annotations

import asyncio
import heapq
import random
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from router.fleet_state import WorkerView
from router.kv.index import InMemoryPrefixIndex, PrefixIndex
from router.kv.resp import REDIS_UNREACHABLE
from router.kv.routing import MAX_HOLDERS, RouteCall, WorkerPool, pick, route_cost
from router.kv.translate import RemoveOp, StoreOp, fleet_hashes_for_prompt
from router.policies import RouteQuery
from schemas import RouteCandidate, RouteDecision

log = structlog.get_logger("jetfleet.router.kv")

OBSERVED_CANDIDATES = 8  # candidates a decision keeps (the winner and the next best)


@dataclass(frozen=True)
class KvRouterConfig:
    prefill_weight: float = 8.0
    """Weight of the blocks a worker must prefill against its decode load, in the cost."""
    prefill_overhead_blocks: int = 4
    """What one prefill costs beyond its tokens, in blocks."""
    temperature: float = 8.0
    """Softmax temperature over costs, in blocks (0: the lowest cost always wins)."""
    reservation_ttl_s: float = 120.0
    """A routed request's reservation in Redis expires after this long if never released."""
    approx_ttl_s: float = 120.0
    """approx: how long a route is remembered as cached on its worker."""
    hint_ttl_s: float = 5.0  # kv: trust this router's own recent routes for this long (0: off)
    host_hit_weight: float = 0.75
    """kv: a prompt block in a worker's host-memory tier counts as this fraction of a GPU hit
    (loading it back over PCIe costs about a quarter of recomputing it; 0: tiers ignored)."""
    load_report_max_age_s: float = 5.0  # older reports are ignored
    redis_fallback: bool = True
    """kv: while Redis is unreachable (an outage, a Sentinel failover), route by the workers'
    reported load and this router's recent routes (policy ``kv-fallback``) instead of failing
    requests with 503; off: a clear 503 ``routing_unavailable``."""
    sample: int = 16
    """kv: workers scored per request besides the holders of its prefix: all of them up to this
    many, else half the least loaded (as last reported) and half at random."""
    max_holders: int = MAX_HOLDERS
    """kv: holders of a request's deepest blocks scored besides the sample, at most."""
    pool_refresh_s: float = 0.25
    """kv: the reported loads routes use are read again at most this often (each read visits
    every candidate: its cost grows with the fleet, this bounds how often it is paid; workers
    report every 250 ms, and the reservations in Redis are current on every route)."""


POOL_STALE_ROUNDS = 4  # a pool this many refresh periods old is read on the route's path


def _blocks(n_tokens: int, block_size: int) -> int:
    return -(-n_tokens // block_size)


class RecentRoutes:
    """Where this router sent which prefixes in the last ``ttl_s`` seconds (in-process).

    ``kv`` uses it as a hint for blocks whose KV events are not indexed yet (a burst of requests
    sharing a new prefix would otherwise scatter before the first one's events arrive); ``approx``
    uses it as its whole index.
    """

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self.index = InMemoryPrefixIndex()
        self._history: deque[tuple[float, str, str, tuple[int, ...]]] = deque()
        self._event_ids: dict[str, int] = {}

    async def _apply(self, model: str, worker: str, op: StoreOp | RemoveOp) -> None:
        eid = self._event_ids.get(worker, 0) + 1
        self._event_ids[worker] = eid
        await self.index.apply(model, worker, eid, 0, [op])

    async def expire(self, now: float) -> None:
        while self._history and now - self._history[0][0] > self.ttl_s:
            _, model, worker, hashes = self._history.popleft()
            await self._apply(model, worker, RemoveOp(worker, hashes))

    async def record(self, now: float, model: str, worker: str, hashes: tuple[int, ...]) -> None:
        if hashes:
            await self._apply(model, worker, StoreOp(worker, hashes))
            self._history.append((now, model, worker, hashes))

    async def match(self, model: str, hashes: tuple[int, ...], now: float) -> dict[str, int]:
        await self.expire(now)
        return await self.index.match(model, hashes)


@dataclass(frozen=True)
class _Pool:
    """A ``WorkerPool`` and what sampling it needs, built from one candidate list."""

    source: Sequence[WorkerView]
    built_at: float
    pool: WorkerPool
    members: frozenset[str]
    least_loaded: tuple[str, ...]


class KvRouter:
    name = "kv"

    def __init__(
        self, index: PrefixIndex, cfg: KvRouterConfig | None = None, seed: int | None = None
    ) -> None:
        self.index = index
        self.cfg = cfg or KvRouterConfig()
        self._rng = random.Random(seed)
        self._recent = RecentRoutes(self.cfg.hint_ttl_s)
        self._fallback_ids: set[str] = set()  # routed while Redis was away: reserved in memory
        self.fallbacks = 0
        self._redis_down = False
        self._pools: dict[tuple[str, int], _Pool] = {}
        self._refreshing: set[tuple[str, int]] = set()

    async def warm(self) -> None:
        """Get the index ready for the first request (scripts loaded, connection open)."""
        await self.index.warm()

    def _reported(self, v: WorkerView, block_size: int, now: float) -> tuple[float, float] | None:
        load = v.load
        if load is None or now - v.load_at > self.cfg.load_report_max_age_s:
            return None
        return (
            load.active_prefill_tokens / block_size
            + self.cfg.prefill_overhead_blocks * load.num_waiting,
            float(load.active_decode_blocks),
        )

    def _pool(self, model: str, candidates: Sequence[WorkerView], now: float) -> _Pool:
        """The pool of a candidate list: built when the list is new (the fleet state keeps one
        while nobody joins or leaves), and read again in the background once its load figures
        are older than ``pool_refresh_s``, while routes go on with the one they have (a read
        visits every candidate: not on a request's path while routes keep coming). One older
        than ``POOL_STALE_ROUNDS`` refreshes (routes paused) is read again before the route."""
        key = (model, id(candidates))  # the cached pool holds the list: its id is not reused
        found = self._pools.get(key)
        if (
            found is None
            or found.source is not candidates
            or now - found.built_at >= POOL_STALE_ROUNDS * self.cfg.pool_refresh_s
        ):  # new, or not read since routes paused: read now (a route after a pause must not
            # go on with the loads of before it)
            return self._build_pool(key, model, candidates, now)
        if now - found.built_at >= self.cfg.pool_refresh_s and key not in self._refreshing:
            self._refreshing.add(key)
            asyncio.get_running_loop().call_soon(self._refresh_pool, key, model, candidates)
        return found

    def _refresh_pool(self, key: tuple[str, int], model: str, cands: Sequence[WorkerView]) -> None:
        self._refreshing.discard(key)
        pool = self._build_pool(key, model, cands, time.monotonic())
        self.index.prepare(model, pool.pool)  # the index's own reading of it, off the path too

    def _build_pool(
        self, key: tuple[str, int], model: str, candidates: Sequence[WorkerView], now: float
    ) -> _Pool:
        block_size = candidates[0].reg.block_size
        reported: dict[str, tuple[float, float]] = {}
        for v in candidates:
            r = self._reported(v, block_size, now)
            if r is not None:
                reported[v.worker_id] = r
        workers = tuple(v.worker_id for v in candidates)
        half = max(self.cfg.sample // 2, 1)
        pw = self.cfg.prefill_weight
        ranked = heapq.nsmallest(
            half,
            workers,
            key=lambda w: pw * reported.get(w, (0.0, 0.0))[0] + reported.get(w, (0.0, 0.0))[1],
        )
        built = _Pool(
            candidates, now, WorkerPool(workers, reported), frozenset(workers), tuple(ranked)
        )
        if len(self._pools) > 32:
            self._pools.clear()
        self._pools[key] = built
        return built

    def _sample(self, pool: _Pool) -> tuple[str, ...]:
        workers = pool.pool.workers
        k = self.cfg.sample
        if len(workers) <= k:
            return workers
        picked = dict.fromkeys(pool.least_loaded)
        while len(picked) < k:
            picked.setdefault(workers[self._rng.randrange(len(workers))], None)
        return tuple(picked)

    async def route(self, query: RouteQuery, candidates: Sequence[WorkerView]) -> RouteDecision:
        t0 = time.perf_counter()
        reg = candidates[0].reg
        block_size = reg.block_size
        hashes = tuple(
            fleet_hashes_for_prompt(
                query.token_ids, block_size, query.lora_name, reg.kv_branch_blocks
            )
        )
        now = time.monotonic()
        pool = self._pool(query.model, candidates, now)
        hints: dict[str, int] = {}
        if self.cfg.hint_ttl_s:
            seen = await self._recent.match(query.model, hashes, now)
            hints = {w: ov for w, ov in seen.items() if w in pool.members}
        call = RouteCall(
            model=query.model,
            request_id=query.request_id,
            block_hashes=hashes,
            new_blocks=_blocks(query.num_prompt_tokens, block_size),
            pool=pool.pool,
            sampled=self._sample(pool),
            hints=hints,
            prefill_weight=self.cfg.prefill_weight,
            prefill_overhead_blocks=self.cfg.prefill_overhead_blocks,
            temperature=self.cfg.temperature,
            rand=self._rng.random(),
            now_ms=int(time.time() * 1000),
            ttl_ms=int(self.cfg.reservation_ttl_s * 1000),
            host_weight=self.cfg.host_hit_weight,
            max_holders=self.cfg.max_holders,
        )
        policy = self.name
        try:
            out = await self.index.route(call)
            if query.request_id in self._fallback_ids:  # migrated now that Redis is back
                self._fallback_ids.discard(query.request_id)
                await self._recent.index.release(query.request_id)
            if self._redis_down:
                self._redis_down = False
                log.info("kv_routing_restored", fallbacks=self.fallbacks)
        except REDIS_UNREACHABLE as exc:
            if not self.cfg.redis_fallback:
                raise
            if not self._redis_down:
                self._redis_down = True
                log.warning("kv_routing_by_load", reason="redis unreachable", error=str(exc))
            # the same cost, over this router's own recent routes and reservations
            out = await self._recent.index.route(call)
            self._fallback_ids.add(query.request_id)
            self.fallbacks += 1
            policy = "kv-fallback"
        if self.cfg.hint_ttl_s:
            await self._recent.record(now, query.model, out.winner, hashes)
        cands = tuple(
            RouteCandidate(s.worker_id, s.overlap_blocks, s.load, s.cost)
            for s in out.best(OBSERVED_CANDIDATES)
        )
        return RouteDecision(
            policy, out.winner, cands, decision_us=(time.perf_counter() - t0) * 1e6
        )

    async def first_token(self, request_id: str) -> None:
        if request_id in self._fallback_ids:
            await self._recent.index.release(request_id, prefill_only=True)
            return
        await self.index.release(request_id, prefill_only=True)

    async def finished(self, request_id: str) -> None:
        if request_id in self._fallback_ids:
            self._fallback_ids.discard(request_id)
            await self._recent.index.release(request_id)
            return
        await self.index.release(request_id)


class ApproxKvRouter:
    """Prefix affinity from routing history, for engines without KV events (in-process)."""

    name = "approx"

    def __init__(self, cfg: KvRouterConfig | None = None, seed: int | None = None) -> None:
        self.cfg = cfg or KvRouterConfig()
        self._rng = random.Random(seed)
        self._recent = RecentRoutes(self.cfg.approx_ttl_s)

    async def route(self, query: RouteQuery, candidates: Sequence[WorkerView]) -> RouteDecision:
        t0 = time.perf_counter()
        now = time.monotonic()
        reg = candidates[0].reg
        block_size = reg.block_size
        hashes = tuple(
            fleet_hashes_for_prompt(
                query.token_ids, block_size, query.lora_name, reg.kv_branch_blocks
            )
        )
        overlaps = await self._recent.match(query.model, hashes, now)
        new_blocks = _blocks(query.num_prompt_tokens, block_size)
        costs = []
        for v in candidates:
            ov = overlaps.get(v.worker_id, 0)
            # load: this router's in-flight requests, each taken as a prompt's worth of blocks
            load = float(v.in_flight * new_blocks)
            # no reservations here: the prompt's own prefill is all the prefill it knows of
            costs.append(
                route_cost(
                    self.cfg.prefill_weight,
                    0,
                    load,
                    new_blocks,
                    ov,
                    self.cfg.prefill_overhead_blocks,
                )
            )
        i = pick(costs, self.cfg.temperature, self._rng.random())
        winner = candidates[i].worker_id
        await self._recent.record(now, query.model, winner, hashes)
        cands = tuple(
            RouteCandidate(v.worker_id, overlaps.get(v.worker_id, 0), v.in_flight * new_blocks, c)
            for v, c in zip(candidates, costs, strict=True)
        )
        return RouteDecision(self.name, winner, cands, decision_us=(time.perf_counter() - t0) * 1e6)

    async def first_token(self, request_id: str) -> None:
        return None

    async def finished(self, request_id: str) -> None:
        return None
