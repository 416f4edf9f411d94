"""A worker's token output: each request's outputs flushed as ``TokenChunk``s on
``fleet.tok.{request_id}``.

First token and end go at once, the rest every flush interval (one flush for the whole worker).
The interval is ``flush_interval_s`` up to ``flush_batch_unit`` requests in flight and grows with
the batch up to ``max_flush_interval_s``: under a big batch a token's latency is dominated by the
engine step anyway, and the worker's message rate stays bounded instead of growing with the batch
(measured: docs/benchmarks.md, "Measurements behind design choices"). A request whose outputs come
at least an interval apart (an engine stepping in real time) is flushed at once
(``WorkerConfig.flush_delay``): the interval would coalesce nothing and delay each token.

While the fence holds (cut off from NATS, ``workers.fence``) nothing goes on the wire; the chunks
of the last seconds are kept (``RecentChunks``) and published again after a reconnect, but those
of requests the routers moved on meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client as NATS

from schemas import TokenChunk, decode, encode
from workers.config import WorkerConfig
from workers.engine import Engine
from workers.fence import Fence
from workers.in_flight import InFlight
from workers.recent_chunks import RecentChunks
from workers.reporting import Reporter, log_task_error
from workers.request_state import ActiveRequest


class TokenOut:
    def __init__(
        self,
        cfg: WorkerConfig,
        nc: NATS,
        engine: Engine,
        fence: Fence,
        flight: InFlight,
        reporter: Reporter,
        finished: Callable[[ActiveRequest], Awaitable[None]],
        log: Any,
    ) -> None:
        """``finished``: a request's last chunk is out."""
        self.cfg = cfg
        self.nc = nc
        self.engine = engine
        self.fence = fence
        self.flight = flight
        self.reporter = reporter
        self.finished = finished
        self.log = log
        self._dirty: set[str] = set()
        self._flush_scheduled = False
        self._urgent_scheduled = False
        self._recent = RecentChunks()
        self._loop = asyncio.get_running_loop()

    def on_ready(self, ar: ActiveRequest, urgent: bool) -> None:
        """``ar`` has outputs to send (``urgent``: its first, or its end)."""
        self._dirty.add(ar.request.request_id)
        now = time.monotonic()
        gap, ar.last_output_at = now - ar.last_output_at, now
        delay = self.cfg.flush_delay(len(self.flight.active), urgent, gap)
        if delay == 0.0:
            if not self._urgent_scheduled:
                self._urgent_scheduled = True
                self._loop.call_soon(self._spawn_flush)
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_later(delay, self._spawn_flush)

    def _spawn_flush(self) -> None:
        self._urgent_scheduled = False
        self._flush_scheduled = False
        task = asyncio.ensure_future(self.flush())
        task.add_done_callback(log_task_error)

    def resume(self) -> None:
        """The fence let go: everything running is flushed."""
        self._dirty.update(self.flight.active)
        self._spawn_flush()

    async def flush(self) -> None:
        if self.fence.holding and not self.flight.stopping:  # cut off: nothing on the wire
            return  # (the dirty set stays: the fence's resume flushes it)
        dirty, self._dirty = self._dirty, set()
        active = self.flight.active
        ready = [ar for ar in map(active.get, dirty) if ar is not None and ar.has_pending()]
        if self.reporter.reported_prefill and any(ar.next_index == 0 for ar in ready):
            # A prefill ended and the last load report still counts it: routers get a new one
            # before these tokens (one connection keeps the order), so a client's next request
            # is not routed against the prefill of the one it just received (the worker holding
            # its prefix would look busy for up to load_interval_s). At most one per flush.
            await self.reporter.load_now()
        publish, tok, fenced = self.nc.publish, self.cfg.subjects.tok, self.flight.fenced
        finished: list[ActiveRequest] = []
        now = time.monotonic()
        for ar in ready:
            rid = ar.request.request_id
            subject, payload = tok(rid), encode(ar.take_chunk())
            if (rid, ar.request.attempt) not in fenced:
                await publish(subject, payload)
                self._recent.add(now, subject, payload)
            if ar.final_sent:
                finished.append(ar)
        for ar in finished:
            await self.finished(ar)

    async def republish_recent(self) -> None:
        """After a NATS reconnect: fence the requests that moved on elsewhere meanwhile (see
        ``workers.fence``), then publish the chunks of the last seconds again."""
        reconnects = self.fence.reconnects()
        recent = [(s, p, decode(p, TokenChunk)) for s, p in self._recent.since(time.monotonic())]
        active = self.flight.active
        running = {(r, ar.request.attempt) for r, ar in active.items()}
        moved = await self.fence.moved_on(running | {(c.request_id, c.attempt) for *_, c in recent})
        for rid in moved & active.keys():
            self.flight.fenced.add((rid, active[rid].request.attempt))
            self.engine.abort(rid)
        again = [(s, p) for s, p, c in recent if c.request_id not in moved]
        for subject, payload in again:
            await self.nc.publish(subject, payload)
        self.log.info("chunks_republished", chunks=len(again), fenced=sorted(moved))
        self.fence.checked(reconnects)
