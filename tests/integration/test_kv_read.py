"""``bucket_values`` reads a whole bucket, tells an empty one from a server that does not answer."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import KeyValueConfig

from base.kv_read import bucket_values

pytestmark = pytest.mark.integration


async def test_every_live_key_and_nothing_deleted(js):
    kv = await js.create_key_value(KeyValueConfig(bucket=f"read-{uuid.uuid4().hex[:8]}"))
    assert await bucket_values(kv) == {}
    for i in range(40):
        await kv.put(f"k{i}", f"v{i}".encode())
    await kv.put("k3", b"newer")
    await kv.delete("k5")
    await kv.purge("k6")
    got = await bucket_values(kv)
    want = {f"k{i}": f"v{i}".encode() for i in range(40) if i not in (5, 6)} | {"k3": b"newer"}
    assert got == want


class _SilentWatcher:
    """A watch whose initial values never end (a server too slow to deliver them)."""

    def __init__(self) -> None:
        self.stopped = False

    async def updates(self, timeout: float) -> Any:
        await asyncio.sleep(timeout)
        raise NatsTimeoutError

    async def stop(self) -> None:
        self.stopped = True


class _SilentBucket:
    def __init__(self) -> None:
        self.watcher = _SilentWatcher()

    async def watchall(self, **_: Any) -> _SilentWatcher:
        return self.watcher


async def test_a_bucket_not_read_in_time_is_an_error_not_an_empty_bucket():
    bucket = _SilentBucket()
    with pytest.raises(NatsTimeoutError, match="not read within"):
        await bucket_values(bucket, timeout_s=0.2)  # type: ignore[arg-type]
    assert bucket.watcher.stopped
