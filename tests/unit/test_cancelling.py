"""Background loops stop even when a cancel is lost: Python 3.11's ``asyncio.wait_for`` (through
which nats-py awaits every KV put) returns its result when the cancel lands in the iteration its
future completes in, and a loop that puts periodically then runs on. A CI run timed out in
``OpsPresence.stop`` for it."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
import structlog

from base.cancelling import cancel_and_wait
from base.ops_presence import OpsPresence
from schemas.discovery import OpsEndpoint
from schemas.subjects import Subjects

SWALLOWS = sys.version_info < (3, 12)  # python/cpython#86296, mended in 3.12


class _Bucket:
    """A KV bucket whose puts after the first wait for the test to answer them, as nats-py's
    ``wait_for`` awaits a reply."""

    def __init__(self) -> None:
        self.puts = 0
        self.deleted: list[str] = []
        self.reply: asyncio.Future[None] | None = None
        self.waiting = asyncio.Event()

    async def put(self, key: str, value: bytes) -> None:
        self.puts += 1
        if self.puts == 1:
            return  # the put of start()
        self.reply = asyncio.get_running_loop().create_future()
        self.waiting.set()
        await asyncio.wait_for(self.reply, 5.0)

    async def delete(self, key: str) -> None:
        self.deleted.append(key)


class _Nats:
    def __init__(self, bucket: _Bucket) -> None:
        self.bucket = bucket

    def jetstream(self) -> Any:
        return self

    async def key_value(self, name: str) -> Any:
        return self.bucket


async def _put_loop(bucket: _Bucket) -> None:
    """A periodic put with no stop condition but its cancel, as the presence's and others'."""
    while True:
        await bucket.put("k", b"v")
        await asyncio.sleep(0.01)


async def _answer_then_cancel(bucket: _Bucket, task: asyncio.Task[Any]) -> None:
    """The reply and the cancel in one loop iteration: the cancel is lost on 3.11."""
    await bucket.waiting.wait()
    assert bucket.reply is not None
    bucket.reply.set_result(None)
    task.cancel()


async def test_a_single_cancel_is_lost_in_the_race() -> None:
    """The premise: without a second cancel the loop runs on (3.11)."""
    bucket = _Bucket()
    bucket.puts = 1  # every put waits
    task = asyncio.create_task(_put_loop(bucket))
    await _answer_then_cancel(bucket, task)
    done, _ = await asyncio.wait({task}, timeout=0.3)
    try:
        assert (task not in done) == SWALLOWS
    finally:
        await cancel_and_wait([task])


async def test_a_loop_whose_cancel_was_lost_is_cancelled_again() -> None:
    bucket = _Bucket()
    bucket.puts = 1
    task = asyncio.create_task(_put_loop(bucket))
    await bucket.waiting.wait()
    assert bucket.reply is not None
    bucket.reply.set_result(None)  # the reply, then the cancel, in one iteration
    stopping = asyncio.ensure_future(cancel_and_wait([task], resend_s=0.05))
    done, _ = await asyncio.wait({stopping}, timeout=2.0)  # (wait_for would cancel it)
    assert stopping in done, "the loop runs on"
    assert task.done()


async def test_cancelled_while_it_waits_it_still_sees_the_tasks_end() -> None:
    lost = asyncio.Event()

    async def ends_at_the_second_cancel() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:  # as a cancel lost in wait_for: it goes on
            lost.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(ends_at_the_second_cancel())
    await asyncio.sleep(0)  # (it starts)
    stopping = asyncio.create_task(cancel_and_wait([task], resend_s=0.05))
    await lost.wait()
    stopping.cancel()  # the caller's stop is cancelled while the task runs on
    assert not task.done()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert task.done()  # it did not return before the task ended


async def test_a_task_that_failed_is_logged_not_raised() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(fails(), name="sampler")
    await asyncio.wait({task})
    with structlog.testing.capture_logs() as logs:
        await cancel_and_wait([task, task])  # done already: nothing to cancel
    assert [(e["event"], e["task"]) for e in logs] == [("task_failed", "sampler")] * 2
    assert "boom" in logs[0]["error"]


async def test_its_own_task_is_not_waited_for() -> None:
    async def stops_itself() -> None:
        me = asyncio.current_task()
        assert me is not None
        await cancel_and_wait([me])

    await asyncio.wait_for(stops_itself(), 2)


async def test_the_presence_stops_when_its_put_swallowed_the_cancel() -> None:
    """The CI hang: ``OpsPresence.stop`` awaited a renewal loop that ran on."""
    bucket = _Bucket()
    endpoint = OpsEndpoint("planner", "p", "http://h:1")
    presence = OpsPresence(_Nats(bucket), Subjects(), endpoint, every_s=0.01)  # type: ignore[arg-type]
    await presence.start()
    await bucket.waiting.wait()  # a renewal waits for its reply
    assert bucket.reply is not None
    bucket.reply.set_result(None)  # the reply, then the stop's cancel, in one iteration
    stopping = asyncio.ensure_future(presence.stop())
    done, _ = await asyncio.wait({stopping}, timeout=3.0)
    assert stopping in done, "the presence renews on"
    assert bucket.deleted == ["planner.p"]
