"""A worker's registration: its heartbeat ends when it deregisters, whatever the cancel met."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from workers.config import WorkerConfig
from workers.engines.mocker.config import MockerConfig
from workers.engines.mocker.engine import MockerEngine
from workers.registry import Registry


class _Bucket:
    """The registrations and heartbeats buckets (one object): the puts of a heartbeat wait for
    the test to answer them."""

    def __init__(self) -> None:
        self.puts = 0
        self.deleted: list[str] = []
        self.in_flight: asyncio.Future[None] | None = None
        self.waiting = asyncio.Event()  # a heartbeat's put waits for its reply

    async def put(self, key: str, value: bytes) -> None:
        self.puts += 1
        if self.puts <= 2:
            return  # registering: the first heartbeat and the registration
        self.in_flight = asyncio.get_running_loop().create_future()
        self.waiting.set()
        await asyncio.wait_for(self.in_flight, 5.0)  # as nats-py awaits a request's reply

    async def delete(self, key: str) -> None:
        self.deleted.append(key)


class _JetStream:
    def __init__(self, bucket: _Bucket) -> None:
        self.bucket = bucket

    async def key_value(self, name: str) -> Any:
        return self.bucket


async def test_deregister_ends_a_heartbeat_whose_cancel_its_put_swallowed() -> None:
    """On Python 3.11 ``asyncio.wait_for`` returns the result of a future that completed just
    before the cancel arrived, and the cancel is lost: a heartbeat cancelled as its put's reply
    came in kept beating, and ``deregister`` waited for it forever."""
    cfg = WorkerConfig("nats://x", Path("."), "m", worker_id="w-1", heartbeat_interval_s=0.01)
    bucket = _Bucket()
    registry = Registry(cfg, _JetStream(bucket), MockerEngine(MockerConfig(), (1, 2)))
    await registry.register()
    await bucket.waiting.wait()
    assert bucket.in_flight is not None
    bucket.in_flight.set_result(None)  # the reply, then the cancel, in one loop iteration
    deregistering = asyncio.ensure_future(registry.deregister())
    done, _ = await asyncio.wait({deregistering}, timeout=2.0)  # (wait_for would cancel it)
    assert deregistering in done, "the heartbeat beats on"
    assert bucket.deleted == ["w-1", "w-1"]  # the registration, then the heartbeat
