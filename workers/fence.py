"""Fencing a worker cut off from NATS, so that it never publishes into token streams that moved on.

A worker whose host drops off the network (or is paused) keeps generating. Meanwhile the routers
expire it (no heartbeat for ``ttl_s``) and migrate its requests: attempt + 1 on another worker.
When the link heals, nothing it produced during the cut may land on those requests' token
subjects: a NATS-only client following ``(attempt, index)`` would splice two attempts into one
answer, or end on the old attempt's final chunk. Three rules, in the order a cut unfolds:

1. **Hold.** The worker PINGs its server every ``probe_s``. With no PONG for ``hold_s`` (or while
   disconnected) it stops writing token chunks: the engine's output waits in each request's
   state. (Written while cut off, a chunk would only wait in the client's or the kernel's buffer
   and go out when the link heals.)
2. **Sever.** With no PONG for ``sever_s`` (at most half the registration TTL, so always before
   any router can have expired it), it resets its connection (``base.connect.sever_nats``): what
   it wrote between the cut and the hold sits in the kernel's send buffer, which TCP would
   deliver at the heal, after the migration; the reset discards it.
3. **Check.** After every reconnect, before anything held is published or anything recent is
   published again, each request is checked against its token stream: when the stream's last
   chunk belongs to a newer attempt, the request moved on; the worker aborts it and publishes
   nothing more for it (its message is acked, so it is not redelivered).

A check that cannot be made (the stream electing a leader) lets the request go on: frontends drop
a stale attempt's chunks anyway, and a fleet-wide NATS outage (nobody migrated) must not turn into
aborted requests. The window left: a request migrated within the last moments before the heal
whose new attempt has not yet published its first chunk passes the check. A cancel with reason
``migrated`` (the frontend's, delivered late) fences its request too.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable

import structlog
from nats.aio.client import Client as NATS

from base.connect import sever_nats
from schemas import Subjects, TokenChunk, decode

log = structlog.get_logger("jetfleet.worker")


class Fence:
    def __init__(
        self,
        nc: NATS,
        subjects: Subjects,
        ttl_s: float,
        on_resume: Callable[[], None],
        probe_s: float = 0.25,
        hold_s: float = 1.0,
    ) -> None:
        self.nc = nc
        self.subjects = subjects
        self.probe_s = probe_s
        self.hold_s = hold_s
        self.sever_s = max(hold_s, min(2.0, ttl_s / 2))
        self.on_resume = on_resume  # called when held output may go out again
        self._ok_at = time.monotonic()
        self._checked_reconnects = self.reconnects()  # reconnects checked so far
        self.severed = 0

    def reconnects(self) -> int:
        return int(self.nc.stats["reconnects"])

    @property
    def holding(self) -> bool:
        """Token chunks must not be written now."""
        silent = time.monotonic() - self._ok_at > self.hold_s
        unchecked = self.reconnects() != self._checked_reconnects
        return unchecked or silent or not self.nc.is_connected

    async def probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self.probe_s)
            await self.probe()

    async def probe(self) -> None:
        was_holding = self.holding
        if not self.nc.is_connected:
            return
        reconnects = self.reconnects()
        try:
            await self.nc.flush(timeout=self.sever_s)  # type: ignore[arg-type]
        except Exception:
            if self.reconnects() != reconnects:  # that PING went to the connection before
                return
            if time.monotonic() - self._ok_at >= self.sever_s and sever_nats(self.nc):
                self.severed += 1
                log.warning("nats_severed", silent_s=round(time.monotonic() - self._ok_at, 2))
            return
        self._ok_at = time.monotonic()
        if was_holding and not self.holding:
            self.on_resume()

    async def moved_on(self, requests: Iterable[tuple[str, int]]) -> set[str]:
        """The request ids whose token stream shows an attempt newer than the one given."""
        stream = self.subjects.stream_name("TOKENS")
        js = self.nc.jetstream()

        async def one(request_id: str, attempt: int) -> str | None:
            with contextlib.suppress(Exception):  # none stored, or the stream is electing
                last = await asyncio.wait_for(
                    js.get_last_msg(stream, self.subjects.tok(request_id)), 2.0
                )
                if decode(last.data or b"", TokenChunk).attempt > attempt:
                    return request_id
            return None

        found = await asyncio.gather(*(one(r, a) for r, a in set(requests)))
        return {r for r in found if r is not None}

    def checked(self, reconnects: int) -> None:
        """The check begun after reconnect number ``reconnects`` is done: held output may go
        out again."""
        self._checked_reconnects = reconnects
        self._ok_at = time.monotonic()
        self.on_resume()
