"""Where a suspended task waits: its chain of awaits, down to the future."""

from __future__ import annotations

import asyncio

from base.task_trace import task_where, tasks_where


async def _inner(gate: asyncio.Event) -> None:
    await gate.wait()


async def _outer(gate: asyncio.Event) -> None:
    await _inner(gate)


async def test_the_chain_of_awaits_is_named_outermost_first() -> None:
    gate = asyncio.Event()
    task = asyncio.create_task(_outer(gate), name="waiter")
    await asyncio.sleep(0)
    where = task_where(task)
    assert [w.split()[-1] for w in where[:3]] == ["_outer", "_inner", "wait"]
    assert where[-1].startswith("Future")  # (uvloop and asyncio name its iterator apart)
    assert "waiter: " in tasks_where() and "_inner" in tasks_where()
    gate.set()
    await task
