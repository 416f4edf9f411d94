"""What a worker's runtime parts share about the requests it runs: the running ones, the ones just
finished (to ignore a redelivery), the ones fenced off (moved on elsewhere: nothing of them goes
on the wire), and the events its loops wait on."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

from workers.request_state import ActiveRequest

RECENT_DONE = 4096  # finished (request_id, attempt) kept to ignore redeliveries


class InFlight:
    def __init__(self, capacity: asyncio.Event) -> None:
        self.active: dict[str, ActiveRequest] = {}
        self.done: OrderedDict[tuple[str, int], None] = OrderedDict()
        self.fenced: set[tuple[str, int]] = set()  # (id, attempt) moved on: publish nothing
        self.capacity = capacity  # set when a slot comes free (the pool feed's)
        self.idle = asyncio.Event()  # set while nothing runs
        self.idle.set()
        self.working = asyncio.Event()  # the inverse: set while a request is in flight
        self.stopping = False
        self.finished_at = 0.0  # monotonic: when the last request in flight ended

    def started(self, ar: ActiveRequest, max_num_seqs: int) -> None:
        self.active[ar.request.request_id] = ar
        self.idle.clear()
        self.working.set()
        if len(self.active) >= max_num_seqs:
            self.capacity.clear()

    def finished(self, ar: ActiveRequest) -> None:
        rid, attempt = ar.request.request_id, ar.request.attempt
        if self.active.get(rid) is ar:
            del self.active[rid]
        self.fenced.discard((rid, attempt))
        self.done[(rid, attempt)] = None
        if len(self.done) > RECENT_DONE:
            self.done.popitem(last=False)
        if not self.active:
            self.idle.set()
            self.working.clear()
            self.finished_at = time.monotonic()
        if not self.stopping:
            self.capacity.set()

    def free_slots(self, max_num_seqs: int) -> int:
        """Requests the engine has room for (none once the worker stops)."""
        return 0 if self.stopping else max_num_seqs - len(self.active)
