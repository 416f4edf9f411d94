"""Whether a stream consume has stopped moving, and why (pure: no clock, no I/O).

A consume that leads (the indexer) keeps its lock as long as its process lives, so a consume
that stops applying while its process runs leaves the fleet's index stale with nothing to
replace it: no error, no lost lead, no log. Two shapes were seen in CI, neither explained: the
loop waited for messages that never came, or never came back from a step. The shell looks at
its consume every so often; once its position has not moved for ``after_s`` while work was
there (messages received and not taken, messages pending on the server, a step running), this
judge says why, and the shell logs it and consumes again from the stored position.

An idle consume (nothing pending anywhere, the loop waiting) is never stalled, however long.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Look:
    """What the shell saw of its consume at one moment."""

    at: float  # monotonic seconds
    applied: int  # the consume's position (the last stream sequence applied)
    waiting: int  # messages received by the client and not yet taken by the loop
    busy_s: float | None  # how long the loop has been in one step (None: waiting for messages)
    pending: int | None  # messages the server has not delivered yet (None: consumer gone)


WHY = {
    "step": "a step has not returned",
    "untaken": "messages received are not taken",
    "gone": "its consumer is gone from the server",
    "undelivered": "the server holds messages it does not deliver",
}
"""A stall's reason (the metric's label) and what it means (the log line's)."""


class StallJudge:
    def __init__(self, after_s: float) -> None:
        """``after_s``: how long the position may stand still while work is there."""
        self.after_s = after_s
        self._applied: int | None = None
        self._since = 0.0

    def quiet_for(self, at: float, applied: int) -> float:
        """Seconds the position has stood still, as of ``at`` (0 when it just moved)."""
        if applied != self._applied:
            self._applied, self._since = applied, at
        return at - self._since

    def due(self, at: float, applied: int) -> bool:
        """Whether the position has stood still long enough to look closer (the shell then
        asks the server for ``pending``, which costs a request)."""
        return self.quiet_for(at, applied) >= self.after_s

    def verdict(self, look: Look) -> str | None:
        """Why the consume is stalled (a key of ``WHY``), or None while it moves or has nothing
        to do."""
        if self.quiet_for(look.at, look.applied) < self.after_s:
            return None
        if look.busy_s is not None and look.busy_s >= self.after_s:
            return "step"
        if look.waiting:
            return "untaken"
        if look.pending is None:
            return "gone"
        if look.pending:
            return "undelivered"
        return None
