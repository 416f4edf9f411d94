"""A frontend's held requests: the shell around ``router/hold_queue.py``'s pure queue.

Once every worker that could serve a request has ``per_worker`` requests waiting for a slot, the
request waits here (``hold``) until a worker has room: a request that ends here makes room at
once (``release``), load reports and joins are looked at every ``HOLD_PUMP_S`` while any wait
(the pump). A request let go is routed past the workers whose queue is full (``busy``), and
stays pending in the queue until the client counts it on its worker (``settle``), so one burst of
room is not given twice. While any wait, the frontend says how many, by model and role
(``HeldRequests``, for the planner: they are in no worker's load report), and once more when
none do.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from nats.aio.client import Client as NATS

from base.cancelling import cancel_and_wait
from router.fleet_state import FleetState
from router.hold_queue import HoldKey, HoldQueue
from schemas import HeldRequests, encode
from schemas.subjects import Subjects

HOLD_PUMP_S = 0.02  # how often held requests look for room (load reports come every 0.25 s)
# a worker's load report older than this is not trusted for its queue (a busy worker reports
# every second at least; an idle one reports once, and that one can be lost)
LOAD_REPORT_MAX_AGE_S = 5.0
HELD_REPORT_S = 0.25  # how often a frontend that holds requests says how many (as load reports)


class Holding:
    def __init__(self, state: FleetState, per_worker: int, nc: NATS, subjects: Subjects) -> None:
        """``per_worker``: the queue every candidate must have before requests are held (0:
        never)."""
        self.state = state
        self.per_worker = per_worker
        self.nc = nc
        self.subjects = subjects
        self.queue = HoldQueue()
        self.let_go: dict[str, HoldKey] = {}  # request id -> its key, until counted
        # the name its reports of held requests go under, for the planner (""; none sent)
        self.reporter = ""
        self.on_held: Callable[[int], None] = lambda _n: None  # requests held now (a gauge)
        self._pump: asyncio.Task[None] | None = None
        self._busy_seen: dict[HoldKey, tuple[float, list[str]]] = {}
        self._reported: set[str] = set()  # models whose last report held some

    def __len__(self) -> int:
        return len(self.queue)

    def held(self, key: HoldKey) -> int:
        return self.queue.held[key]

    async def stop(self) -> None:
        if self._pump is not None:
            await cancel_and_wait([self._pump])

    async def hold(self, priority: int, key: HoldKey) -> bool:
        """Wait here while every candidate has a queue; whether the request was held (it is
        then pending in the queue until ``settle``, and its id is to be given to
        ``letting_go``)."""
        if self.per_worker <= 0:
            return False
        if not self.state.candidates(key[0], key[1], lora=key[2]):
            return False  # no worker at all: the 503 comes as without holding
        if key not in self.queue.held and self.room(key) > self.queue.pending[key]:
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.queue.hold(key, priority, waiter)
        self.release()
        if not waiter.done() and (self._pump is None or self._pump.done()):
            self._pump = asyncio.create_task(self._pump_held(), name="hold-pump")
        self.on_held(len(self.queue))
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():  # let go as its caller was cancelled
                self.queue.routed(key)
            else:
                waiter.cancel()
                self.queue.forget(key)
                self.on_held(len(self.queue))
            raise
        return True

    def letting_go(self, request_id: str, key: HoldKey) -> None:
        """A request ``hold`` let go: pending until ``settle``."""
        self.let_go[request_id] = key

    def settle(self, request_id: str) -> None:
        """A request let go is counted on its worker now, or will not be sent."""
        key = self.let_go.pop(request_id, None)
        if key is not None:
            self.queue.routed(key)

    def room(self, key: HoldKey) -> int:
        model, roles, lora = key
        if not self.state.candidates(model, roles, lora=lora):  # none left: on to wait, then 503
            return self.queue.held[key]
        now = time.monotonic()
        fresh_after = now - LOAD_REPORT_MAX_AGE_S
        return self.state.room(model, roles, lora, self.per_worker, fresh_after, now)

    def busy(self, key: HoldKey) -> list[str]:
        """The candidates with a full queue, which a request let go skips (unless that is all
        of them): the room that let it go is another worker's. Looked at once a pump period
        (a pass over the candidates: ~1 ms at 1,024 workers), not once a request."""
        now = time.monotonic()
        cached = self._busy_seen.get(key)
        if cached is not None and now - cached[0] < HOLD_PUMP_S:
            return cached[1]
        model, roles, lora = key
        cands = self.state.candidates(model, roles, lora=lora)
        fresh_after = now - LOAD_REPORT_MAX_AGE_S
        busy = [v.worker_id for v in cands if v.queue_depth(fresh_after) >= self.per_worker]
        if len(busy) == len(cands):
            busy = []
        if len(self._busy_seen) > 256:
            self._busy_seen.clear()
        self._busy_seen[key] = (now, busy)
        return busy

    def release(self) -> None:
        """Let held requests go for the room there is now."""
        if len(self.queue) and self.queue.release(self.room):
            self.on_held(len(self.queue))

    async def _pump_held(self) -> None:
        """While requests are held: let them go as load reports and joins make room, and say
        how many wait, for the planner, and once more when none do."""
        report_at = 0.0
        while len(self.queue):
            await asyncio.sleep(HOLD_PUMP_S)
            self.release()
            if time.monotonic() >= report_at:
                report_at = time.monotonic() + HELD_REPORT_S
                await self._report()
        await self._report()

    async def _report(self) -> None:
        if not self.reporter:
            return
        by_model: dict[str, dict[str, int]] = {}
        for (model, roles, _lora), n in self.queue.held.items():
            per_role = by_model.setdefault(model, {})
            per_role[roles[0]] = per_role.get(roles[0], 0) + n
        for model in sorted(set(by_model) | self._reported):
            report = HeldRequests(self.reporter, model, time.time(), by_model.get(model, {}))
            with contextlib.suppress(Exception):  # the next report tells it again
                await self.nc.publish(self.subjects.held(model, self.reporter), encode(report))
        self._reported = set(by_model)
