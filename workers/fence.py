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

Rules 1 and 2 are about the connection, rule 3 about each worker's requests: the PING is a
``ConnectionProbe``, one per connection, which the ``Fence`` of every worker on that connection
reads (``jetfleet worker --replicas N`` runs N workers on one connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable

import structlog
from nats.aio.client import Client as NATS

from base.cancelling import cancel_and_wait
from base.connect import sever_nats
from schemas import Subjects, TokenChunk, decode

log = structlog.get_logger("jetfleet.worker")


class ConnectionProbe:
    """Rule 1's PING, once per NATS connection: the fences of every worker sharing the
    connection (``jetfleet worker --replicas N``) read the one probe, instead of each PINGing
    the server four times a second. The probing runs while at least one fence watches it."""

    def __init__(self, nc: NATS, ttl_s: float, probe_s: float = 0.25, hold_s: float = 1.0) -> None:
        self.nc = nc
        self.probe_s = probe_s
        self.hold_s = hold_s
        self.sever_s = max(hold_s, min(2.0, ttl_s / 2))
        self.ok_at = time.monotonic()  # the last PONG (or the last reconnect checked)
        self.severed = 0
        self._fences: list[Fence] = []
        self._task: asyncio.Task[None] | None = None

    @property
    def silent(self) -> bool:
        """No PONG for ``hold_s``, or disconnected."""
        return time.monotonic() - self.ok_at > self.hold_s or not self.nc.is_connected

    def reconnects(self) -> int:
        return int(self.nc.stats["reconnects"])

    def answered(self) -> None:
        self.ok_at = time.monotonic()

    async def watch(self, fence: Fence) -> None:
        """Probe for ``fence`` until cancelled (the fence's task: the worker cancels it when it
        drains); the last fence to leave stops the probing."""
        self._fences.append(fence)
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="nats-probe")
        try:
            await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            self._fences.remove(fence)
            if not self._fences and self._task is not None:
                task, self._task = self._task, None
                await cancel_and_wait([task])

    async def _run(self) -> None:
        while self._fences:  # (a cancel swallowed by the flush's wait_for: ends here)
            await asyncio.sleep(self.probe_s)
            if self._fences:
                await self.probe()

    async def probe(self) -> None:
        held = [fence for fence in self._fences if fence.holding]
        if not self.nc.is_connected:
            return
        reconnects = self.reconnects()
        try:
            await self.nc.flush(timeout=self.sever_s)  # type: ignore[arg-type]
        except Exception:
            if self.reconnects() != reconnects:  # that PING went to the connection before
                return
            if time.monotonic() - self.ok_at >= self.sever_s and sever_nats(self.nc):
                self.severed += 1
                log.warning("nats_severed", silent_s=round(time.monotonic() - self.ok_at, 2))
            return
        self.answered()
        for fence in held:
            if not fence.holding:
                fence.on_resume()


class Fence:
    """One worker's fence: its own reconnect checks (rule 3), the connection's probe (rules 1
    and 2: its own, or one shared by the workers of a process)."""

    def __init__(
        self,
        nc: NATS,
        subjects: Subjects,
        ttl_s: float,
        on_resume: Callable[[], None],
        probe: ConnectionProbe | None = None,
    ) -> None:
        self.nc = nc
        self.subjects = subjects
        self.probe = probe or ConnectionProbe(nc, ttl_s)
        self.on_resume = on_resume  # called when held output may go out again
        self._checked_reconnects = self.reconnects()  # reconnects checked so far

    def reconnects(self) -> int:
        return self.probe.reconnects()

    @property
    def holding(self) -> bool:
        """Token chunks must not be written now."""
        return self.reconnects() != self._checked_reconnects or self.probe.silent

    async def probe_loop(self) -> None:
        """The worker's fence task: the connection is probed while it runs."""
        await self.probe.watch(self)

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
        self.probe.answered()
        self.on_resume()
