"""Leases in a JetStream KV bucket, as the frontends follow them: who runs each background
response or batch (``responses_background.py``, ``batch_service.py``) and until when."""

from __future__ import annotations

import contextlib
from typing import TypeVar

import msgspec
from nats.js.kv import KeyValue

L = TypeVar("L")


async def follow_leases(
    kv: KeyValue, lease_type: type[L], leases: dict[str, tuple[L, int]]
) -> None:
    """Keep ``leases`` (key -> (lease, revision)) as the bucket holds them, until cancelled."""
    async for entry in await kv.watchall():
        if entry is None:  # the end of the initial values
            continue
        if entry.operation in ("DEL", "PURGE") or not entry.value:
            leases.pop(entry.key, None)
            continue
        with contextlib.suppress(msgspec.DecodeError):
            lease = msgspec.msgpack.decode(entry.value, type=lease_type)
            leases[entry.key] = (lease, int(entry.revision or 0))
