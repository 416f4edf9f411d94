"""Types of the one-step routing call shared by both index implementations.

``route`` = match the request's blocks, score the candidates with the cost below, pick the lowest
(ties broken with the caller's random number; with a temperature, sample a softmax over
``-cost / temperature``), and reserve the winner's predicted load — atomically.

    cost = prefill_weight * (max(active_prefill_blocks + new_blocks - overlap_blocks, 0)
                             + prefill_overhead_blocks)
           + active_decode_blocks + new_blocks

**Who is scored.** The router passes its ``WorkerPool`` (every worker it may send the request
to, with the load each last reported) and a few ``sampled`` workers (all of the pool when it is
small; else a sample, see ``router.py``) and the workers it hints. The index scores the sampled
and hinted workers, and the pool's holders of the request's deepest blocks: groups of equal
overlap, deepest first, up to ``max_holders`` in all (a group that does not fit gives its first
members, in an order of the index's choosing). So a route costs the same at 16 workers and at
1,024, yet a worker that holds more of the prompt than any other is always seen.

``overlap_blocks`` is the larger of what the index holds and the caller's hint (blocks it routed to
that worker moments ago, whose KV events may not be indexed yet). What the index holds is the
worker's GPU prefix ``g``, continued through the next ``h`` blocks held in any of its tiers (host
memory: loaded back over PCIe instead of recomputed), as ``g + floor(host_weight * h)``.
``active_*`` is the larger of the reservations every router holds on the worker and the worker's own
latest load report.
``prefill_overhead_blocks`` is what one prefill costs beyond its tokens, in blocks (an engine
step pays a fixed cost per prefilling sequence: the mocker's 16.5 ms is about 17 blocks of 64
tokens). It enters ``active_prefill_blocks`` once per request still to prefill, so two cache hits
queued on a worker weigh more than one; for the new request it is the same on every candidate.
The reservation (prefill: new - overlap blocks + the overhead, decode: new blocks) is released
when the request ends (its prefill part at the first token), and expires by itself after
``ttl_ms`` if the router that made it dies.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import count

MAX_HOLDERS = 8  # holders of a request's deepest blocks scored besides the sample
_pool_ids = count(1)


@dataclass(frozen=True, slots=True)
class WorkerPool:
    """The workers a router may send a request of one kind to, as it knows them now. Built once
    per change of who is in it or of what they reported, and shared by every route until then
    (an index may keep encodings of it by ``key``)."""

    workers: tuple[str, ...]
    reported: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    """worker -> (prefill blocks, decode blocks) it reported; absent: nothing recent."""
    key: int = field(default_factory=lambda: next(_pool_ids))

    def load_of(self, worker_id: str) -> tuple[float, float]:
        return self.reported.get(worker_id, (0.0, 0.0))


@dataclass(frozen=True, slots=True)
class RouteCall:
    model: str
    request_id: str  # "" = score only, reserve nothing
    block_hashes: tuple[int, ...]
    new_blocks: int  # blocks the prompt occupies (ceil(tokens / block_size))
    pool: WorkerPool
    sampled: tuple[str, ...]  # scored whatever they hold (workers of the pool)
    hints: Mapping[str, int] = field(default_factory=dict)
    """worker -> overlap the caller expects before the index knows it; also scored."""
    prefill_weight: float = 1.0
    prefill_overhead_blocks: int = 0  # per request still to prefill (see above)
    temperature: float = 0.0
    rand: float = 0.0  # uniform in [0, 1): tie-break / sampling draw, from the caller
    now_ms: int = 0
    ttl_ms: int = 120_000
    # a worker's GPU prefix continues through the blocks its lower tiers (host memory) hold,
    # each counted as this fraction of a block, rounded down (0: lower tiers ignored)
    host_weight: float = 0.0
    max_holders: int = MAX_HOLDERS

    def explicit(self) -> tuple[str, ...]:
        """The sampled workers, then the hinted ones not sampled: always scored."""
        extra = tuple(w for w in self.hints if w not in set(self.sampled))
        return self.sampled + extra


@dataclass(frozen=True, slots=True)
class Scored:
    worker_id: str
    overlap_blocks: int
    load: float  # active prefill + decode blocks used in the cost
    cost: float


@dataclass(frozen=True, slots=True)
class RouteOutcome:
    winner: str
    scored: tuple[Scored, ...]  # every candidate scored (sampled and hinted first)

    def by_worker(self) -> dict[str, Scored]:
        return {s.worker_id: s for s in self.scored}

    def overlap(self, worker_id: str) -> int:
        found = self.by_worker().get(worker_id)
        return found.overlap_blocks if found is not None else 0

    def cost(self, worker_id: str) -> float:
        return self.by_worker()[worker_id].cost

    def load(self, worker_id: str) -> float:
        return self.by_worker()[worker_id].load

    def best(self, n: int) -> tuple[Scored, ...]:
        """The ``n`` lowest-cost candidates, the winner first (what an observation keeps)."""
        rest = sorted((s for s in self.scored if s.worker_id != self.winner), key=_by_cost)
        win = [s for s in self.scored if s.worker_id == self.winner]
        return tuple(win + rest)[:n]


def _by_cost(s: Scored) -> tuple[float, str]:
    return s.cost, s.worker_id


def route_cost(
    prefill_weight: float,
    active_prefill_blocks: float,
    active_decode_blocks: float,
    new_blocks: int,
    overlap_blocks: int,
    prefill_overhead_blocks: int,
) -> float:
    """The cost above: the one rule of the in-memory index and the approximate router (the
    Lua ``route`` script is its mirror, held to it by the index contract and equivalence tests)."""
    need = max(active_prefill_blocks + new_blocks - overlap_blocks, 0) + prefill_overhead_blocks
    return prefill_weight * need + active_decode_blocks + new_blocks


SOFTMAX_CUTOFF = 4.0
"""With a temperature, a candidate costing more than this many temperatures above the best is
not drawn (its softmax weight would be under e^-4, 1.8%): near-equal candidates share the load,
and a clear loser (a worker that must prefill five blocks another holds, at the default
temperature of 8 blocks: e^-5) is never sent one request in a hundred and fifty for nothing.
The Lua ``route`` script holds the same constant."""


def pick(costs: Sequence[float], temperature: float, rand: float) -> int:
    """Index of the winner (same rule as the Lua script)."""
    best = min(costs)
    if temperature > 0:
        cut = SOFTMAX_CUTOFF * temperature
        weights = [math.exp(-(c - best) / temperature) if c - best <= cut else 0.0 for c in costs]
        target = rand * sum(weights)
        acc = 0.0
        for i, w in enumerate(weights):
            acc += w
            if target < acc:
                return i
        return max(i for i, w in enumerate(weights) if w > 0)  # rand at its top end
    ties = [i for i, c in enumerate(costs) if c == best]
    return ties[min(len(ties) - 1, int(rand * len(ties)))]


def deepest_holders(
    overlaps: Mapping[str, int], pool: Sequence[str], skip: set[str], cap: int
) -> list[tuple[str, int]]:
    """The pool's holders to score besides the explicit candidates (``skip``): by overlap,
    deepest first, up to ``cap`` (ties in a group in pool order). The rule of the in-memory index;
    the Lua route's is the same, its order within a group the slots'."""
    if cap <= 0:
        return []
    order = {w: i for i, w in enumerate(pool)}
    held = [(w, ov) for w, ov in overlaps.items() if ov > 0 and w in order and w not in skip]
    held.sort(key=lambda x: (-x[1], order[x[0]]))
    return held[:cap]
