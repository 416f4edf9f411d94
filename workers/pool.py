"""The pool subject for the workers of one process: one pull subscription, however many.

Every worker of a pool takes requests from the pool's shared durable pull consumer
(``pool_{model}_{role}``, ``schemas.streams.pool_consumer``), as many as its engine has free
sequence slots (32 at most a fetch), and pulls only while it has some. A process running many
workers (``jetfleet worker --replicas N``) pulls once for all of them: the ``PoolFeed`` fetches
as many messages as its members have free slots together (32 at most) and hands each to the
member with the most free slots; one that arrives when no member has room (all of them filled up
through their own subjects meanwhile, or draining) is NAKed, redelivered at once to whoever pulls
next. So an idle process sends one pull request a second, not one per worker, and the server's
limit of waiting pull requests per consumer (``max_waiting``, 512 by default) is not reached by a
thousand workers.

``capacity`` is the members' shared signal: a worker sets it when a request of its ends (a slot
came free) and when it starts or drains; the feed waits on it only when no member has a free slot.
The pulling runs while at least one member is in the feed (each member's pool task, cancelled when
its worker drains).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from base.cancelling import cancel_and_wait
from base.consume import Fetch, pull_loop
from schemas import Subjects
from schemas.streams import pool_consumer

log = structlog.get_logger("jetfleet.worker")

MAX_FETCH = 32  # messages a fetch asks for at most


@dataclass(frozen=True, eq=False)
class _Member:
    free_slots: Callable[[], int]  # sequences its engine can still take (0 while draining)
    take: Callable[[Msg], Awaitable[None]]  # admit one request message


class PoolFeed:
    """The pool consumer's pull loop of a process, shared by its workers (see the module
    docstring)."""

    def __init__(self, js: JetStreamContext, subjects: Subjects, model: str, role: str) -> None:
        self.js = js
        self.subjects = subjects
        self.spec = pool_consumer(subjects, model, role)
        self.capacity = asyncio.Event()
        self.log = log.bind(model=model, role=role)
        self._members: list[_Member] = []
        self._task: asyncio.Task[None] | None = None

    async def serve(
        self, free_slots: Callable[[], int], take: Callable[[Msg], Awaitable[None]]
    ) -> None:
        """Take pool requests for a worker until cancelled (its pool task)."""
        member = _Member(free_slots, take)
        self._members.append(member)
        self.capacity.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="pool")
        try:
            await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            self._members.remove(member)
            self.capacity.set()  # the others' room is what counts now
            if not self._members and self._task is not None:
                task, self._task = self._task, None
                await cancel_and_wait([task])

    def free_slots(self) -> int:
        return sum(max(m.free_slots(), 0) for m in self._members)

    async def _run(self) -> None:
        try:
            stream = self.subjects.stream_name("REQUESTS")
            psub = await self.js.pull_subscribe_bind(self.spec.durable, stream)
            await pull_loop(psub, self._next_fetch, self._dispatch, self.log)
        except Exception as exc:  # (cancelled: not an Exception) the pool is lost to this process
            self.log.error("pool_pull_failed", error=repr(exc))
            raise

    async def _next_fetch(self) -> Fetch | None:
        """As many as the members have room for, waiting until one has some."""
        while self._members:
            free = self.free_slots()
            if free > 0:
                return Fetch(min(free, MAX_FETCH))
            self.capacity.clear()
            await self.capacity.wait()
        return None

    async def _dispatch(self, msg: Msg) -> None:
        best = max(self._members, key=lambda m: m.free_slots(), default=None)
        if best is None or best.free_slots() <= 0:
            with contextlib.suppress(Exception):
                await msg.nak()
            return
        await best.take(msg)
