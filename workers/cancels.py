"""Cancels for the workers of one process: one ``fleet.cancel.*`` subscription, however many.

Cancels are core NATS on ``fleet.cancel.{request_id}``, published by whoever gives a request up
(a frontend whose client hung up, a migration). A worker cannot know which request ids will be
cancelled, so it listens to all of them. A process running many workers (``jetfleet worker
--replicas N``) would otherwise receive and decode every cancel N times; the ``CancelFeed`` holds
the one subscription and hands each cancel, decoded once, to the workers holding its request
(looked up in each member's in-flight map: a dictionary lookup per member, ~40 us per cancel at
1,024 members, against 1,024 decodes). An undecodable cancel is dead-lettered once.

The subscription is made when the first member joins and dropped when the last one leaves, so a
process of one worker subscribes and unsubscribes exactly when that worker starts and drains.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from base.consume import DeadLetters
from base.deadletter import UNCOUNTED, DeadLetterMetrics
from schemas import CancelRequested, Subjects

log = structlog.get_logger("jetfleet.worker")

OnCancel = Callable[[CancelRequested], Awaitable[None]]


@dataclass(frozen=True, eq=False)
class _Member:
    active: Mapping[str, object]  # the member's requests in flight, by request id
    on_cancel: OnCancel


class CancelFeed:
    """The cancel subscription of a process, shared by its workers (see the module docstring)."""

    def __init__(
        self, nc: NATS, subjects: Subjects, dead_letters: DeadLetterMetrics = UNCOUNTED
    ) -> None:
        self.nc = nc
        self.subjects = subjects
        self.letters = DeadLetters(nc, subjects, "worker", dead_letters)
        self._members: list[_Member] = []
        self._sub: Any = None
        self._lock = asyncio.Lock()  # workers start and drain concurrently

    async def subscribe(self, active: Mapping[str, object], on_cancel: OnCancel) -> Membership:
        """Hand ``on_cancel`` every cancel of a request in ``active`` until the membership is
        unsubscribed."""
        member = _Member(active, on_cancel)
        async with self._lock:
            if self._sub is None:
                self._sub = await self.nc.subscribe(self.subjects.cancel_all(), cb=self._on_msg)
            self._members.append(member)
        return Membership(self, member)

    async def leave(self, member: _Member) -> None:
        """``member`` gets no more cancels; the last to leave drops the subscription."""
        async with self._lock:
            if member in self._members:
                self._members.remove(member)
            if not self._members and self._sub is not None:
                sub, self._sub = self._sub, None
                await sub.unsubscribe()

    def holders(self, request_id: str) -> list[OnCancel]:
        """The members holding ``request_id`` (more than one only while a newer attempt of it
        runs beside the old one in this process)."""
        return [m.on_cancel for m in self._members if request_id in m.active]

    async def _on_msg(self, msg: Msg) -> None:
        cancel = await self.letters.decoded(msg, CancelRequested, terminate=False)
        if cancel is None:
            return
        for on_cancel in self.holders(cancel.request_id):
            try:
                await on_cancel(cancel)
            except Exception as exc:  # one member's failure must not keep it from the others
                log.error("cancel_failed", request_id=cancel.request_id, error=repr(exc))


@dataclass(frozen=True)
class Membership:
    """One member's share of the feed; ``unsubscribe`` as a NATS subscription's (the runtime
    drops it with its subscriptions when it drains)."""

    feed: CancelFeed
    member: _Member

    async def unsubscribe(self) -> None:
        await self.feed.leave(self.member)
