"""``bucket_values`` reads a whole bucket, tells an empty one from a server that does not answer,
and does not stop at a watch's end marker that came before the values."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import KeyValueConfig

from base.kv_read import BucketReadTimeout, bucket_keys, bucket_values

pytestmark = pytest.mark.integration


async def test_every_live_key_and_nothing_deleted(js):
    kv = await js.create_key_value(KeyValueConfig(bucket=f"read-{uuid.uuid4().hex[:8]}"))
    assert await bucket_values(kv) == {}
    for i in range(40):
        await kv.put(f"k{i}", f"v{i}".encode())
    await kv.put("k3", b"newer")
    await kv.delete("k5")
    await kv.purge("k6")  # the bucket's last message is a purge marker
    got = await bucket_values(kv)
    want = {f"k{i}": f"v{i}".encode() for i in range(40) if i not in (5, 6)} | {"k3": b"newer"}
    assert got == want
    await kv.delete("k3")
    await kv.put("k5", b"back")
    want = {k: v for k, v in want.items() if k != "k3"} | {"k5": b"back"}
    assert await bucket_values(kv) == want


@dataclass
class _Entry:
    key: str
    value: bytes | None
    revision: int
    operation: str | None = None


class _Watcher:
    """A watch that delivers ``updates`` in order, then nothing (a server gone quiet)."""

    def __init__(self, updates: list[_Entry | None]) -> None:
        self.updates_left = list(updates)
        self.stopped = False

    async def updates(self, timeout: float) -> _Entry | None:
        if self.updates_left:
            return self.updates_left.pop(0)
        await asyncio.sleep(timeout)
        raise NatsTimeoutError

    async def stop(self) -> None:
        self.stopped = True


class _Bucket:
    def __init__(self, last_seq: int, updates: list[_Entry | None]) -> None:
        self.watcher = _Watcher(updates)
        self.last_seq = last_seq

    async def status(self) -> Any:
        state = SimpleNamespace(messages=self.last_seq, last_seq=self.last_seq)
        return SimpleNamespace(stream_info=SimpleNamespace(state=state))

    async def watchall(self, **_: Any) -> _Watcher:
        return self.watcher


async def test_a_marker_before_the_values_does_not_end_the_read():
    """nats-py sends the end marker before values it has not parsed yet (nats-io/nats.py#842)."""
    bucket = _Bucket(3, [None, _Entry("a", b"1", 1), _Entry("b", b"2", 2), _Entry("c", b"3", 3)])
    got = await bucket_values(bucket, timeout_s=5)  # type: ignore[arg-type]
    assert got == {"a": b"1", "b": b"2", "c": b"3"}
    assert bucket.watcher.stopped


async def test_a_bucket_not_read_in_time_is_an_error_not_an_empty_bucket():
    bucket = _Bucket(2, [None, _Entry("a", b"1", 1)])  # the newest entry never comes
    with pytest.raises(BucketReadTimeout, match="not read within"):
        await bucket_values(bucket, timeout_s=0.2)  # type: ignore[arg-type]
    assert bucket.watcher.stopped


async def test_a_delete_delivered_after_its_put_removes_the_key():
    """A put and its delete both arrive when the read begins during them, or when the ordered
    consumer behind the watch is reset and replays from a sequence."""
    bucket = _Bucket(3, [_Entry("a", b"1", 1), _Entry("b", b"2", 2), _Entry("a", None, 3, "DEL")])
    assert await bucket_values(bucket, timeout_s=5) == {"b": b"2"}  # type: ignore[arg-type]


async def test_keys_alone(js):
    kv = await js.create_key_value(KeyValueConfig(bucket=f"keys-{uuid.uuid4().hex[:8]}"))
    assert await bucket_keys(kv) == set()
    for i in range(5):
        await kv.put(f"k{i}", b"x" * 1000)
    await kv.delete("k2")
    assert await bucket_keys(kv) == {"k0", "k1", "k3", "k4"}
