"""KV cache block events: stream ``FLEET_KV``, subject fleet.kv.{model}.{worker}.

Modeled on vLLM's ``kv_events.py``: a batch envelope around a tagged union of
``BlockStored | BlockRemoved | AllBlocksCleared``. ``event_id`` increases by one per batch per
worker, so a consumer can detect a gap and rebuild that worker's entries. ``block_hashes`` are the
engine's own hashes (opaque for vLLM); the indexer recomputes the fleet's chained hashes from
``token_ids`` (see ``schemas.hashing``) and keeps the mapping engine hash -> fleet hash.

``medium`` says which tier of the worker's cache the event is about (vLLM's field of the same
name): ``GPU`` (the default, left out on the wire), ``CPU`` (host memory: vLLM's CPU offloading,
LMCache, the mocker's ``--num-cpu-blocks``) or ``DISK``. A block is in the worker's cache while it
is in any tier. ``AllBlocksCleared`` without a medium clears every tier. Version 2 of the batch
added ``medium``; a worker writes a batch whose events are all about GPU memory as version 1, so
an older indexer still reads it.
"""

from __future__ import annotations

from typing import Literal

import msgspec

Medium = Literal["GPU", "CPU", "DISK"]
GPU: Medium = "GPU"
OFFLOAD_MEDIA: tuple[Medium, ...] = ("CPU", "DISK")  # the tiers below GPU memory


class BlockStored(msgspec.Struct, frozen=True, tag="stored", omit_defaults=True):
    block_hashes: tuple[int, ...]  # engine hashes of the newly filled blocks, in chain order
    parent_block_hash: int | None  # engine hash of the block before the first one (None: root)
    token_ids: tuple[int, ...]  # len == block_size * len(block_hashes)
    block_size: int
    lora_name: str | None = None
    medium: Medium = GPU


class BlockRemoved(msgspec.Struct, frozen=True, tag="removed", omit_defaults=True):
    block_hashes: tuple[int, ...]  # engine hashes evicted from the cache
    medium: Medium = GPU


class AllBlocksCleared(msgspec.Struct, frozen=True, tag="cleared", omit_defaults=True):
    medium: Medium | None = None  # None: every tier


KvCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KvEventBatch(msgspec.Struct, frozen=True, omit_defaults=True):
    worker_id: str
    model: str
    event_id: int  # per worker, +1 per batch, starting at 1
    ts_s: float
    events: tuple[KvCacheEvent, ...]
    v: int = 2


def batch_version(events: tuple[KvCacheEvent, ...]) -> int:
    """1 when no event names a tier below GPU memory (readable by version-1 consumers), else 2."""
    return 2 if any(ev.medium is not None and ev.medium != GPU for ev in events) else 1


class WorkerIndexSnapshot(msgspec.Struct, frozen=True, omit_defaults=True):
    """One worker's entries in a prefix index snapshot."""

    model: str
    worker_id: str
    event_id: int  # last applied event id of this worker
    engine_hashes: bytes  # 8 big-endian bytes per block, paired with fleet_hashes
    fleet_hashes: bytes


class IndexSnapshot(msgspec.Struct, frozen=True, omit_defaults=True):
    """The whole prefix index as of FLEET_KV stream sequence ``seq`` (object store
    ``fleet_kv_snapshots``, object ``latest``): an indexer restores it, then replays from
    ``seq + 1``, so the stream only has to keep what came after the last snapshot."""

    seq: int
    ts_s: float
    workers: tuple[WorkerIndexSnapshot, ...] = ()
    v: int = 1
