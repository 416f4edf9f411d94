"""Types of the one-step routing call shared by both index implementations.

``route`` = match the request's blocks, score every candidate with the cost below, pick the
lowest (ties broken with the caller's random number; with a temperature, sample a softmax over
``-cost / temperature``), and reserve the winner's predicted load — atomically.

    cost = prefill_weight * (max(active_prefill_blocks + new_blocks - overlap_blocks, 0)
                             + prefill_overhead_blocks)
           + active_decode_blocks + new_blocks

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

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CandidateLoad:
    worker_id: str
    reported_prefill_blocks: float = 0.0
    reported_decode_blocks: float = 0.0
    hint_overlap_blocks: int = 0  # overlap the caller expects before the index knows it


@dataclass(frozen=True, slots=True)
class RouteCall:
    model: str
    request_id: str  # "" = score only, reserve nothing
    block_hashes: tuple[int, ...]
    new_blocks: int  # blocks the prompt occupies (ceil(tokens / block_size))
    candidates: tuple[CandidateLoad, ...]
    prefill_weight: float = 1.0
    prefill_overhead_blocks: int = 0  # per request still to prefill (see above)
    temperature: float = 0.0
    rand: float = 0.0  # uniform in [0, 1): tie-break / sampling draw, from the caller
    now_ms: int = 0
    ttl_ms: int = 120_000
    # a worker's GPU prefix continues through the blocks its lower tiers (host memory) hold,
    # each counted as this fraction of a block, rounded down (0: lower tiers ignored)
    host_weight: float = 0.0


@dataclass(frozen=True, slots=True)
class RouteOutcome:
    winner: str
    overlaps: tuple[int, ...]  # per candidate, in call order
    costs: tuple[float, ...]
    loads: tuple[float, ...]  # active prefill + decode blocks used in the cost


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


def pick(costs: list[float], temperature: float, rand: float) -> int:
    """Index of the winner (same rule as the Lua script)."""
    import math

    best = min(costs)
    if temperature > 0:
        weights = [math.exp(-(c - best) / temperature) for c in costs]
        target = rand * sum(weights)
        acc = 0.0
        for i, w in enumerate(weights):
            acc += w
            if target < acc:
                return i
        return len(costs) - 1
    ties = [i for i, c in enumerate(costs) if c == best]
    return ties[min(len(ties) - 1, int(rand * len(ties)))]
