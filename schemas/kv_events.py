"""KV cache block events: stream ``FLEET_KV``, subject fleet.kv.{model}.{worker}.

Modeled on vLLM's ``kv_events.py``: a batch envelope around a tagged union of
``BlockStored | BlockRemoved | AllBlocksCleared`` (+ ``ShapeChanged``). ``event_id`` increases by
one per batch per worker, so a consumer can detect a gap and rebuild that worker's entries.

Version 3 (written by every worker of this release): ``block_hashes`` and ``parent_block_hash``
are the **fleet's** chained hashes (``schemas.hashing``, tagged with their branch), computed in the
worker, which knows its engine's blocks (vLLM's opaque hashes are translated there, as NVIDIA
Dynamo's publishers do); the indexer applies them as they come and keeps no per-block state.
``token_ids`` may be left out. ``ShapeChanged`` says whether the worker's blocks in a tier are
prefix-closed (every block held has its parent held, see ``workers/kv_shape.py``), so the index
can bisect its chains instead of walking them. Versions 1 and 2 carried the engine's own hashes
and the token ids (the indexer recomputed the fleet's); an indexer still reads them from
engines that hashed like the fleet (see ``router/kv/translate.py``).

``medium`` says which tier of the worker's cache the event is about (vLLM's field of the same
name): ``GPU`` (the default, left out on the wire), ``CPU`` (host memory: vLLM's CPU offloading,
LMCache, the mocker's ``--num-cpu-blocks``) or ``DISK``. A block is in the worker's cache while it
is in any tier. ``AllBlocksCleared`` without a medium clears every tier.
"""

from __future__ import annotations

from typing import Literal

import msgspec

Medium = Literal["GPU", "CPU", "DISK"]
GPU: Medium = "GPU"
OFFLOAD_MEDIA: tuple[Medium, ...] = ("CPU", "DISK")  # the tiers below GPU memory


class BlockStored(msgspec.Struct, frozen=True, tag="stored", omit_defaults=True):
    block_hashes: tuple[int, ...]  # the newly filled blocks, in chain order (v3: fleet hashes)
    parent_block_hash: int | None  # the block before the first one (None: root)
    token_ids: tuple[int, ...] = ()  # block_size * len(block_hashes), or none (v3)
    block_size: int = 0
    lora_name: str | None = None
    medium: Medium = GPU


class BlockRemoved(msgspec.Struct, frozen=True, tag="removed", omit_defaults=True):
    block_hashes: tuple[int, ...]  # blocks evicted from the cache (v3: fleet hashes)
    medium: Medium = GPU


class AllBlocksCleared(msgspec.Struct, frozen=True, tag="cleared", omit_defaults=True):
    medium: Medium | None = None  # None: every tier


class ShapeChanged(msgspec.Struct, frozen=True, tag="shape", omit_defaults=True):
    """From now on the worker's blocks in ``medium`` are (or are no longer) prefix-closed."""

    prefix_closed: bool
    medium: Medium = GPU


KvCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared | ShapeChanged

KV_BATCH_VERSION = 3  # fleet hashes, optional token ids, ShapeChanged


class KvEventBatch(msgspec.Struct, frozen=True, omit_defaults=True):
    worker_id: str
    model: str
    event_id: int  # per worker, +1 per batch, starting at 1
    ts_s: float
    events: tuple[KvCacheEvent, ...]
    v: int = KV_BATCH_VERSION


class SlotTableSnapshot(msgspec.Struct, frozen=True, omit_defaults=True):
    """A model's slot table: which holder owns which bit of the holder bitmaps."""

    model: str
    slots: dict[str, int]  # holder -> slot
    version: int = 0


class BlocksSnapshot(msgspec.Struct, frozen=True, omit_defaults=True):
    """One model's blocks on one shard of the index (a part of a snapshot, an object of its
    own): each block hash (8 big-endian bytes) with its holder bitmap, and the shard's bitmap of
    prefix-closed slots."""

    model: str
    shard: int
    hashes: bytes
    bitmaps: tuple[bytes, ...]
    nohole: bytes = b""


class IndexSnapshot(msgspec.Struct, frozen=True, omit_defaults=True):
    """The prefix index as of the stream positions it records (object store
    ``fleet_kv_snapshots``, object ``latest``; the blocks in the objects ``parts`` name). Taken
    while the indexers go on applying: each part is read in bounded steps, after the positions,
    so what a part holds is at least as new as them, and replaying the stream from them on an
    index restored from it ends where the live one is (a block's bit is whatever its last event
    made it; a clear gives the holder a new slot).

    Version 2: the sharded layout (version 1 held each worker's engine -> fleet map: no index of
    this layout restores it; the indexer rebuilds from the stream and the workers instead)."""

    ts_s: float
    shards: int
    positions: tuple[dict[str, int], ...]  # per shard: indexer group -> stream sequence
    tables: tuple[SlotTableSnapshot, ...] = ()
    parts: tuple[str, ...] = ()  # objects holding the BlocksSnapshots
    v: int = 2
