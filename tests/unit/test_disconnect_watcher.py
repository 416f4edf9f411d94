"""A client that disconnects stops its handler even when one cancellation is swallowed: Python
3.11's ``asyncio.wait_for`` (through which nats-py awaits every JetStream publish ack) returns
its result instead of raising when the cancel lands in the iteration its future completes in."""

from __future__ import annotations

import asyncio
from typing import Any

from router.frontend.asgi import DisconnectWatcher


class _Client:
    def __init__(self, ack: asyncio.Future[int] | None = None) -> None:
        self.gone = asyncio.Event()
        self.ack = ack

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        if self.ack is not None:  # a publish ack completes in the iteration the client leaves
            self.ack.set_result(1)
        return {"type": "http.disconnect"}


async def _handler(ack: asyncio.Future[int], client: _Client, published: list[int]) -> int:
    try:
        async with DisconnectWatcher(client.receive):
            published.append(await asyncio.wait_for(ack, 10))
            while True:  # the stream goes on: one publish after another
                published.append(await asyncio.wait_for(asyncio.sleep(0.01, 1), 10))
    except asyncio.CancelledError:
        task = asyncio.current_task()
        assert task is not None
        return task.uncancel()


async def test_a_cancel_swallowed_by_wait_for_is_sent_again() -> None:
    ack: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    client, published = _Client(ack), []
    task = asyncio.create_task(_handler(ack, client, published))
    await asyncio.sleep(0)  # the handler waits for its ack, the watcher on receive
    client.gone.set()
    done, _ = await asyncio.wait({task}, timeout=2)
    task.cancel()
    assert task in done, "the handler ran on after its client left"
    assert published[0] == 1  # the first cancel was swallowed (3.11): the watcher sent another
    assert task.result() == 0  # and took its own extra cancels back


async def test_a_disconnect_cancels_the_handler_once() -> None:
    client = _Client()

    async def handler() -> int:
        try:
            async with DisconnectWatcher(client.receive):
                await asyncio.Event().wait()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            assert task is not None
            return task.uncancel()
        return -1

    task = asyncio.create_task(handler())
    await asyncio.sleep(0)
    client.gone.set()
    assert await asyncio.wait_for(task, 2) == 0  # nothing left over for the handler
