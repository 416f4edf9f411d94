"""Waiting on a condition instead of sleeping: from a coroutine (``wait_for``), from plain code
(``wait_until``), for a line a process prints (``wait_line``)."""

from __future__ import annotations

import asyncio
import inspect
import re
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from base.task_trace import tasks_where


class _Deadline:
    def __init__(self, timeout: float, what: str) -> None:
        self.timeout, self.what = timeout, what
        self.at = time.monotonic() + timeout

    def met(self, value: Any) -> bool:
        """``value`` is truthy; past the deadline, fail with it."""
        if value:
            return True
        if time.monotonic() > self.at:
            raise AssertionError(
                f"{self.what} not met within {self.timeout}s (last value {value!r})"
            )
        return False


def task_stacks() -> str:
    """Where every task of the running loop is now: what a wait that ran out was waiting on
    (for a failure's message, when the code under test runs in the test's own loop)."""
    return tasks_where()  # each task's chain of awaits (print_stack shows only its outermost)


async def wait_for(
    condition: Callable[[], Any | Awaitable[Any]], timeout: float = 10.0, interval: float = 0.05
) -> Any:
    """Poll ``condition`` (sync or async) until it is truthy (returned); fail after ``timeout``
    s."""
    deadline = _Deadline(timeout, "condition")
    while True:
        last = condition()
        if inspect.isawaitable(last):
            last = await last
        if deadline.met(last):
            return last
        await asyncio.sleep(interval)


def wait_until(
    condition: Callable[[], Any],
    timeout: float = 10.0,
    what: str = "condition",
    interval: float = 0.1,
) -> Any:
    """``wait_for`` outside an event loop: poll ``condition`` until it is truthy (returned);
    fail after ``timeout`` s saying ``what`` was awaited."""
    deadline = _Deadline(timeout, what)
    while not deadline.met(last := condition()):
        time.sleep(interval)
    return last


def wait_line(
    path: Path, pattern: str | re.Pattern[str], timeout: float, proc: subprocess.Popen[Any]
) -> re.Match[str]:
    """Until ``pattern`` is found in ``path`` (the log ``proc`` writes); fail with the log's tail
    at once if ``proc`` exits first, or after ``timeout`` s."""

    def printed() -> re.Match[str] | None:
        text = path.read_text(errors="replace")
        found = re.search(pattern, text)
        assert found or proc.poll() is None, f"exited before printing {pattern!r}:\n{text[-3000:]}"
        return found

    try:
        match: re.Match[str] = wait_until(printed, timeout, f"{pattern!r} printed")
    except AssertionError as exc:
        if proc.poll() is not None:  # the tail is in the message already
            raise
        raise AssertionError(f"{exc}\n{path.read_text(errors='replace')[-3000:]}") from None
    return match
