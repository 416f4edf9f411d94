"""Read a whole KV bucket once, the way a listing can be trusted.

The callers this replaced listed keys with ``KeyValue.keys()`` and read any exception as "no keys
yet", so a slow server made a fleet look empty (``jetfleet status`` reported no models on a
loaded machine). Nor is the watch's end-of-initial-values marker enough: nats-py can send it
before values the server already sent have been parsed (nats-io/nats.py#842). So the bucket's
stream is asked for its last sequence first, and the watch (in stream order, the newest entry of
each key) is read until that sequence has been delivered. An empty bucket is an empty dict; a
bucket not read within ``timeout_s`` is an error (``BucketReadTimeout``), never an empty or
partial answer."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.kv import KeyValue

_REMOVED = ("DEL", "PURGE")


class BucketReadTimeout(NatsTimeoutError):
    def __init__(self, timeout_s: float) -> None:
        super().__init__(timeout_s)
        self.timeout_s = timeout_s

    def __str__(self) -> str:
        return f"nats: a KV bucket was not read within {self.timeout_s} s"


async def bucket_values(kv: KeyValue, timeout_s: float = 30.0) -> dict[str, bytes]:
    """The current value of every key in ``kv`` (deleted and purged keys left out)."""
    return await _read(kv, timeout_s, meta_only=False)


async def bucket_keys(kv: KeyValue, timeout_s: float = 30.0) -> set[str]:
    """Every key in ``kv`` (deleted and purged keys left out); the values are not sent."""
    return set(await _read(kv, timeout_s, meta_only=True))


async def _read(kv: KeyValue, timeout_s: float, meta_only: bool) -> dict[str, bytes]:
    values: dict[str, bytes] = {}
    watcher: Any = None
    try:
        async with asyncio.timeout(timeout_s):
            state = (await kv.status()).stream_info.state
            if not state.messages:
                return values
            last = state.last_seq
            watcher = await kv.watchall(meta_only=meta_only)
            seen = 0
            while seen < last:
                entry = await watcher.updates(timeout=timeout_s)
                if entry is None:  # the marker: not trusted to mean the end (above)
                    continue
                seen = max(seen, entry.revision or 0)
                if entry.operation in _REMOVED:
                    values.pop(entry.key, None)
                else:
                    values[entry.key] = entry.value or b""
    except TimeoutError as exc:  # the deadline's, or a request's (nats.errors.TimeoutError)
        raise BucketReadTimeout(timeout_s) from exc
    finally:
        if watcher is not None:
            with contextlib.suppress(Exception):
                await watcher.stop()
    return values
