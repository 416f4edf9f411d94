"""Stopping a service's background tasks when a cancel can be lost.

On Python 3.11 ``asyncio.wait_for`` returns the result of a future that completed in the loop
iteration its cancel arrived in, and the cancel is gone (python/cpython#86296, mended in 3.12).
nats-py awaits every request's reply (a KV put, a publish's ack, a flush) through ``wait_for``, so
a loop that puts every few seconds and is cancelled as a reply comes in carries on, and a
``stop()`` that awaits it waits forever: seen in a heartbeat (31 of 1,024 workers draining at
once) and in the operations presence (a CI run timed out in its stop).

``cancel_and_wait`` sends the cancel again until each task has ended: a loop with no other stop
condition ends at its next await. It is for tasks whose ``finally`` does not await long (a
second cancel would interrupt it); a task with such cleanup ends on a flag of its own. What a
task failed with is logged, not raised: a stop goes on whatever its loops met.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import structlog

log = structlog.get_logger("jetfleet.tasks")

RESEND_S = 0.5


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]], resend_s: float = RESEND_S) -> None:
    """Cancel ``tasks`` and wait until every one has ended, cancelling again each ``resend_s``
    those still running. Their results and errors are dropped. Cancelled while it waits, it
    still sees them end (with more cancels), then raises ``CancelledError``: a caller's stop
    leaves nothing running behind it. A task that had failed is logged (its error is not
    raised: the stop goes on)."""
    current = asyncio.current_task()
    all_tasks = [t for t in tasks if t is not current]  # (itself: it would never end)
    pending = {t for t in all_tasks if not t.done()}
    interrupted = False
    while pending:
        for task in pending:
            task.cancel()
        try:
            _done, pending = await asyncio.wait(pending, timeout=resend_s)
        except asyncio.CancelledError:
            interrupted = True
    for task in all_tasks:
        if task.done() and not task.cancelled() and (error := task.exception()) is not None:
            log.warning("task_failed", task=task.get_name(), error=repr(error))
    if interrupted:
        raise asyncio.CancelledError
