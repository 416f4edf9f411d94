"""What every JetStream consumer does: its pull loop, and its dead letters.

- **The pull loop** (``pull_loop``): ask the caller what to fetch next (``Fetch``: how many
  messages, how long to wait; None: stop), fetch, hand each message to the handler in order,
  again. A fetch that times out (nothing to take) goes straight to the next; any other failure
  (NATS reconnecting) is logged and backed off ``FETCH_BACKOFF_S``, and the loop goes on. The
  caller's question is where consumers differ: the router service and the connectors fetch a
  fixed batch until their stop event (``until``), a worker's pool loop only what its engine has
  room for, the planner closes its intervals between fetches. A fetch can return more than
  it asked for (nats-py hands over everything already in the subscription's queue, such as what
  a timed-out pull request brought in late): the loop handles ``batch`` and NAKs the rest,
  redelivered at once to whoever pulls next, so a worker never starts more than it has room for.
- **Dead letters** (``DeadLetters``, one per component): a message that does not decode, or
  decodes to something no one may act on, is published on ``{prefix}.dlq.{component}`` with
  the reason and terminated (never redelivered to spread), counted in
  ``jetfleet_dead_letters_total{component}``, and the consumer carries on. A
  refused ``Request`` whose id can name a subject also ends its client's token stream at once
  with an error chunk. Nothing here raises: a failure to dead-letter or terminate is logged or
  swallowed, never allowed to stop the consumer.

Acks are the consumer's own business (on finish, ack-all at an interval's end...): the loop
never acks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext

from base.deadletter import UNCOUNTED, DeadLetterMetrics, dead_letter
from schemas import Request, Subjects, WireDecodeError, decode, encode
from schemas.tokens import error_chunk
from schemas.validate import is_subject_token

log = structlog.get_logger("jetfleet.consume")

FETCH_BACKOFF_S = 0.5  # after a failed fetch (not a timeout): NATS is reconnecting

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Fetch:
    """One fetch of a pull consumer."""

    batch: int  # messages at most
    timeout_s: float = 1.0  # how long to wait for the first of them


NextFetch = Callable[[], Awaitable[Fetch | None]]
"""What to fetch next, waiting as long as the consumer needs to (None: the loop ends)."""


def until(stop: asyncio.Event, batch: int, timeout_s: float = 1.0) -> NextFetch:
    """Fetches of ``batch`` messages each, until ``stop`` is set."""
    fetch = Fetch(batch, timeout_s)

    async def next_fetch() -> Fetch | None:
        return None if stop.is_set() else fetch

    return next_fetch


async def pull_loop(
    psub: JetStreamContext.PullSubscription,
    next_fetch: NextFetch,
    handle: Callable[[Msg], Awaitable[None]],
    logger: Any = log,
) -> None:
    """Fetch what ``next_fetch`` asks for and ``handle`` each message, until it says None
    (see the module docstring). ``logger``: the caller's (its bound fields go with the warning
    of a failed fetch)."""
    while (want := await next_fetch()) is not None:
        try:
            msgs = await psub.fetch(batch=want.batch, timeout=want.timeout_s)
        except (NatsTimeoutError, TimeoutError):
            continue
        except Exception as exc:  # reconnecting: back off, carry on
            logger.warning("fetch_failed", error=str(exc))
            await asyncio.sleep(FETCH_BACKOFF_S)
            continue
        for msg in msgs[: want.batch]:
            await handle(msg)
        for msg in msgs[want.batch :]:  # more than asked for: back to the stream at once
            with contextlib.suppress(Exception):
                await msg.nak()


@dataclass(frozen=True)
class DeadLetters:
    """Where one component's unusable messages go (see the module docstring)."""

    nc: NATS
    subjects: Subjects
    component: str  # "worker", "router", "planner", "connector-local"...
    metrics: DeadLetterMetrics = UNCOUNTED  # the process's (one per registry)

    def __post_init__(self) -> None:
        self.metrics.letters.labels(self.component)  # from 0, so increase() sees the first

    async def record(self, msg: Msg, reason: str) -> None:
        """Dead-letter ``msg`` and leave it be: a core NATS message (nothing to terminate), or
        one its consumer settles itself (the planner's ack-all, the indexer's position)."""
        await dead_letter(self.nc, self.subjects, self.component, msg, reason, self.metrics)

    async def refuse(self, msg: Msg, reason: str) -> None:
        """Dead-letter ``msg`` with ``reason`` and terminate it."""
        await self.record(msg, reason)
        with contextlib.suppress(Exception):
            await msg.term()

    async def decoded(self, msg: Msg, kind: type[T], *, terminate: bool = True) -> T | None:
        """``msg``'s payload as a ``kind``; undecodable: refused (``terminate=False``: only
        recorded) with the decoder's reason, and None."""
        try:
            return decode(msg.data, kind)
        except WireDecodeError as exc:
            await (self.refuse if terminate else self.record)(msg, str(exc))
            return None

    async def refuse_request(
        self, msg: Msg, req: Request, problem: str, worker_id: str = ""
    ) -> None:
        """A decodable but invalid ``Request`` (``schemas.validate.request_problem``): refused,
        and its client, when its id can name a subject, ended by an error chunk at once."""
        reason = f"invalid request: {problem}"
        await self.refuse(msg, reason)
        if is_subject_token(req.request_id):
            chunk = error_chunk(req.request_id, req.attempt, 0, reason, worker_id)
            with contextlib.suppress(Exception):
                await self.nc.publish(self.subjects.tok(req.request_id), encode(chunk))
