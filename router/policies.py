"""Routing policies: pick one worker for a request from the live candidates.

Every policy is pure given its inputs (and its own RNG/counter state) and returns a
``RouteDecision`` naming the winner and, for each candidate, the load figure and cost it used, so
every decision can be explained afterwards (it travels in the ``RequestObservation``).

- ``round-robin``: candidates sorted by worker id, a counter per model walks them in turn.
- ``random``: uniform choice (seedable).
- ``least-loaded``: cost = requests on the worker / its capacity, where requests on the worker
  is the larger of its last load report (running + waiting) and this router's own in-flight count
  (reports lag by up to one report interval; our own count does not). Ties broken randomly.
- ``pool``: no choice here: the request goes to the pool subject and the first worker with free
  capacity pulls it (pull-based balancing, useful when routers cannot see loads).

The KV-aware policy (``kv``) plugs in behind the same interface.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from router.fleet_state import WorkerView
from schemas import RouteCandidate, RouteDecision

POLICY_NAMES = ("kv", "round-robin", "random", "least-loaded", "approx", "pool")


@dataclass(frozen=True, slots=True)
class RouteQuery:
    model: str
    token_ids: tuple[int, ...]
    request_id: str = ""
    lora_name: str | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.token_ids)


class RoutingPolicy(Protocol):
    name: str

    def choose(self, query: RouteQuery, candidates: Sequence[WorkerView]) -> RouteDecision:
        """Pick a winner from a non-empty candidate list."""


class Router(Protocol):
    """What the routing library calls: async, and told when a request's load changes."""

    name: str

    async def route(self, query: RouteQuery, candidates: Sequence[WorkerView]) -> RouteDecision:
        """Pick a winner (and reserve its load, for policies that keep reservations)."""

    async def first_token(self, request_id: str) -> None:
        """The request's prefill is done."""

    async def finished(self, request_id: str) -> None:
        """The request ended (or moved away): release what was reserved for it."""


class LocalRouter:
    """A pure policy behind the ``Router`` interface; nothing to reserve or release."""

    def __init__(self, policy: RoutingPolicy) -> None:
        self.policy = policy
        self.name = policy.name

    async def route(self, query: RouteQuery, candidates: Sequence[WorkerView]) -> RouteDecision:
        return self.policy.choose(query, candidates)

    async def first_token(self, request_id: str) -> None:
        return None

    async def finished(self, request_id: str) -> None:
        return None


def _decision(
    name: str, winner: str, started: float, cands: Sequence[RouteCandidate] = ()
) -> RouteDecision:
    return RouteDecision(
        policy=name,
        worker_id=winner,
        candidates=tuple(cands),
        decision_us=(time.perf_counter() - started) * 1e6,
    )


class RoundRobin:
    name = "round-robin"

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def choose(self, query: RouteQuery, candidates: Sequence[WorkerView]) -> RouteDecision:
        t0 = time.perf_counter()
        ordered = sorted(candidates, key=lambda v: v.worker_id)
        i = self._next.get(query.model, 0)
        self._next[query.model] = i + 1
        return _decision(self.name, ordered[i % len(ordered)].worker_id, t0)


class RandomChoice:
    name = "random"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def choose(self, query: RouteQuery, candidates: Sequence[WorkerView]) -> RouteDecision:
        t0 = time.perf_counter()
        return _decision(self.name, self._rng.choice(list(candidates)).worker_id, t0)


class LeastLoaded:
    name = "least-loaded"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def choose(self, query: RouteQuery, candidates: Sequence[WorkerView]) -> RouteDecision:
        t0 = time.perf_counter()
        scored = [
            RouteCandidate(
                worker_id=v.worker_id,
                load=float(v.queued_estimate()),
                cost=v.queued_estimate() / v.capacity,
            )
            for v in candidates
        ]
        best = min(c.cost for c in scored)
        winner = self._rng.choice([c for c in scored if c.cost == best]).worker_id
        return _decision(self.name, winner, t0, scored)


def make_policy(name: str, seed: int | None = None) -> RoutingPolicy | None:
    """The policy object for ``name``; ``None`` for ``pool`` (the pool subject decides)."""
    if name == "round-robin":
        return RoundRobin()
    if name == "random":
        return RandomChoice(seed)
    if name == "least-loaded":
        return LeastLoaded(seed)
    if name == "pool":
        return None
    if name in ("kv", "approx"):
        raise ValueError(f"{name!r} is a KV-aware router: use router.routers.build_router")
    raise ValueError(f"unknown routing policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
