"""Read a whole KV bucket once, by a watch whose initial values end with a marker.

``KeyValue.keys()`` is not fit for this: it waits 5 s for each key and turns a slow server into
an exception a caller cannot tell from an empty bucket, so a loaded machine reads as "no models".
Here an empty bucket is an empty dict, and a server that does not answer within ``timeout_s`` is
an error (``BucketReadTimeout``, a ``nats.errors.TimeoutError``), never an empty answer."""

from __future__ import annotations

import asyncio
import contextlib

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.kv import KeyValue


class BucketReadTimeout(NatsTimeoutError):
    def __init__(self, timeout_s: float) -> None:
        super().__init__(timeout_s)
        self.timeout_s = timeout_s

    def __str__(self) -> str:
        return f"nats: a KV bucket was not read within {self.timeout_s} s"


async def bucket_values(kv: KeyValue, timeout_s: float = 30.0) -> dict[str, bytes]:
    """The current value of every key in ``kv`` (deleted and purged keys left out)."""
    watcher = await kv.watchall(ignore_deletes=True)
    values: dict[str, bytes] = {}
    try:
        async with asyncio.timeout(timeout_s):
            while (entry := await watcher.updates(timeout=timeout_s)) is not None:  # type: ignore[no-untyped-call]
                if entry.value:
                    values[entry.key] = entry.value
    except TimeoutError as exc:  # the deadline's, or one update's (nats.errors.TimeoutError)
        raise BucketReadTimeout(timeout_s) from exc
    finally:
        with contextlib.suppress(Exception):
            await watcher.stop()  # type: ignore[no-untyped-call]
    return values
