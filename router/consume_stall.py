"""Whether a stream consume has stopped moving, and why (pure: no clock, no I/O).

A consume that leads (the indexer) keeps its lock as long as its process lives, so a consume
that stops applying while its process runs would leave the fleet's index stale with nothing to
replace it: no error, no lost lead, no log. The shell looks at its consume every so often
(``Look``); once work has waited ``after_s`` with the position standing still all along
(messages received and not taken, messages the server holds for it, a step running, or its
consumer gone from the server), the judge says why, and the shell logs it and consumes again
from the stored position.

The clock runs only while work waits: an idle consume is never stalled, and the first work
after an idle spell starts the clock afresh.
"""

from __future__ import annotations

from dataclasses import dataclass

WHY = {
    "step": "a step has not returned",
    "untaken": "messages received are not taken",
    "gone": "its consumer is gone from the server",
    "undelivered": "the server holds messages it does not deliver",
}
"""A stall's reason (the metric's label) and what it means (the log line's)."""

MAX_BACKOFF = 8  # a consume restarted again and again waits at most this many times longer


@dataclass(frozen=True)
class Look:
    """What the shell saw of its consume at one moment."""

    at: float  # monotonic seconds
    applied: int  # the consume's position (the last stream sequence applied)
    waiting: int  # messages received by the client and not yet taken by the loop
    busy: bool  # the loop is in a step (not waiting for messages)
    pending: int | None  # messages the server has not delivered yet (None: consumer gone)

    def work(self) -> str | None:
        """Where work waits (a key of ``WHY``), or None: nothing to do."""
        if self.busy:
            return "step"
        if self.waiting:
            return "untaken"
        if self.pending is None:
            return "gone"
        if self.pending:
            return "undelivered"
        return None


def stall_after(after_s: float, restarts: int) -> float:
    """How long work may wait for a consume restarted ``restarts`` times in a row: doubled each
    time up to ``MAX_BACKOFF`` times, so a store slow enough to fail every first step after a
    restart (its caches cold) is given the time instead of restarted forever."""
    return float(after_s * min(2 ** max(restarts, 0), MAX_BACKOFF))


class StallJudge:
    def __init__(self, after_s: float) -> None:
        """``after_s``: how long work may wait with the position standing still."""
        self.after_s = after_s
        self._applied: int | None = None
        self._since: float | None = None  # work seen waiting since, the position still

    def waited_s(self, at: float) -> float:
        """How long work has waited with the position still, as of ``at`` (0: none waits)."""
        return 0.0 if self._since is None else at - self._since

    def verdict(self, look: Look) -> str | None:
        """Why the consume is stalled (a key of ``WHY``), or None while it moves, has nothing
        to do, or has not waited ``after_s`` yet."""
        work = look.work()
        if look.applied != self._applied or work is None:
            self._applied, self._since = look.applied, None
            if work is None:
                return None
        if self._since is None:
            self._since = look.at
        return work if look.at - self._since >= self.after_s else None
