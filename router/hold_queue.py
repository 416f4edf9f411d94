"""Requests a frontend holds while every worker that could serve them has a queue.

A request routed to a worker that is busy waits in that worker's engine queue, and stays there
when a new worker joins: the planner scales out because queues are long, and the queued requests
would not move to the capacity it added. So once every candidate has ``waiting_per_worker``
requests waiting for a slot (``WorkerView.queue_depth``), a frontend holds new requests
itself, by priority then arrival, and routes each when a worker has room again: one that
finished a request, or one that joined. The total a fleet accepts before it sheds (503) is the
same as without holding (``FleetState.saturated`` counts the held); only where they wait
changes.

``HoldQueue`` is the pure part: who waits, in what order, and who is let go for the room the
caller measures. ``pending`` counts those let go that the fleet state does not count yet (the
shell, ``router/holding.py``, calls ``routed`` once the client's ``launch`` counted one on its
worker, or it will not be sent), so one burst of room is not given twice.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

HoldKey = tuple[str, tuple[str, ...], str | None]  # model, roles, LoRA adapter


class Waiter(Protocol):
    """What a held request waits on (an ``asyncio.Future``): released with ``set_result``."""

    def done(self) -> bool: ...

    def set_result(self, result: None, /) -> None: ...


@dataclass(order=True, slots=True)
class _Held:
    priority: int
    seq: int
    key: HoldKey = field(compare=False)
    waiter: Waiter = field(compare=False)


class HoldQueue:
    def __init__(self) -> None:
        self._heap: list[_Held] = []
        self._seq = itertools.count()
        self.held: Counter[HoldKey] = Counter()  # waiting, per key
        self.pending: Counter[HoldKey] = Counter()  # let go, not yet routed

    def __len__(self) -> int:
        return sum(self.held.values())

    def hold(self, key: HoldKey, priority: int, waiter: Waiter) -> None:
        """``waiter`` waits behind those of lower ``priority`` value and earlier arrival."""
        heapq.heappush(self._heap, _Held(priority, next(self._seq), key, waiter))
        self.held[key] += 1

    def forget(self, key: HoldKey) -> None:
        """A held request left without being let go (its client went away)."""
        self._drop(key)
        if not self.held:
            self._heap.clear()  # only the forgotten were left
        elif len(self._heap) > 2 * len(self) + 64:  # many forgotten: not kept until let go
            self._heap = [e for e in self._heap if not e.waiter.done()]
            heapq.heapify(self._heap)

    def _drop(self, key: HoldKey) -> None:
        self.held[key] -= 1
        if self.held[key] <= 0:
            del self.held[key]

    def routed(self, key: HoldKey) -> None:
        """A request let go is counted on its worker now (or will not be sent)."""
        self.pending[key] -= 1
        if self.pending[key] <= 0:
            del self.pending[key]

    def release(self, room: Callable[[HoldKey], int]) -> int:
        """Let go, in order, as many per key as ``room(key)`` less those pending; returns how
        many. A key without room does not stop the others'."""
        budgets: dict[HoldKey, int] = {}
        kept: list[_Held] = []
        released = 0
        while self._heap:
            if all(budgets.get(k, 1) <= 0 for k in self.held):
                break  # no room for anyone still held (nobody held: the rest are forgotten)
            entry = heapq.heappop(self._heap)
            if entry.waiter.done():  # forgotten (its client went away)
                continue
            budget = budgets.get(entry.key)
            if budget is None:
                budget = budgets[entry.key] = room(entry.key) - self.pending[entry.key]
            if budget <= 0:
                kept.append(entry)
                continue
            budgets[entry.key] = budget - 1
            entry.waiter.set_result(None)
            self._drop(entry.key)
            self.pending[entry.key] += 1
            released += 1
        for entry in kept:
            heapq.heappush(self._heap, entry)
        return released
