"""Where asyncio tasks wait: the chain of awaits of a suspended task, for a stall's log line.

``Task.get_stack`` gives only the outermost frame of a suspended coroutine; the awaits below it
are followed here (``cr_await``), down to the future the innermost one waits on.
"""

from __future__ import annotations

import asyncio
from typing import Any


def task_where(task: asyncio.Task[Any], most: int = 16) -> list[str]:
    """Where a suspended task waits: its chain of awaits, outermost first, as ``file:line
    function`` (the last entry names the future it waits on)."""
    out: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None and len(out) < most:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is None:  # a future, or a coroutine that has ended
            out.append(type(awaited).__name__)
            break
        code = frame.f_code
        out.append(f"{code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno} {code.co_name}")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return out


def tasks_where() -> str:
    """Every task of the running loop and where it waits, one task a line."""
    lines = []
    for task in sorted(asyncio.all_tasks(), key=lambda t: t.get_name()):
        lines.append(f"{task.get_name()}: " + " > ".join(task_where(task)))
    return "\n".join(lines)
