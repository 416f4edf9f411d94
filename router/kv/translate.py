"""A worker's ``KvEventBatch`` as index operations. Pure, and stateless.

Since batch version 3 the worker sends the fleet's own block hashes and tells when a tier's blocks
stop (or start again) being prefix-closed (``workers/kv_relay.py``): each event maps to one op on
one holder, and the indexer keeps nothing per block. A holder is the worker, for its GPU memory,
or one of its lower tiers (``tier_holder``): each has its own slot in the holder bitmaps, so a
block counts as cached on the worker while any of its holders has it.

Batches of versions 1 and 2 carried the engine's own hashes, computed before the fleet's hashes
carried their branch tags: no index of this layout can place them (``legacy``), and the indexer
asks such a worker to publish its cache again, which a worker of this release does as version 3.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schemas.hashing import DEFAULT_BRANCH_BLOCKS, block_hashes, hash_seed
from schemas.kv_events import (
    GPU,
    KV_BATCH_VERSION,
    OFFLOAD_MEDIA,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventBatch,
    Medium,
    ShapeChanged,
)


@dataclass(frozen=True, slots=True)
class StoreOp:
    worker_id: str  # the holder
    hashes: tuple[int, ...]  # fleet block hashes now held


@dataclass(frozen=True, slots=True)
class RemoveOp:
    worker_id: str
    hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ClearOp:
    """The holder starts empty (its slot is renewed: nothing of before is read again)."""

    worker_id: str


@dataclass(frozen=True, slots=True)
class ShapeOp:
    """Whether the holder's blocks are prefix-closed from now on; an index may bisect its chains
    when they are, and must walk them block by block otherwise."""

    worker_id: str
    hole_free: bool


IndexOp = StoreOp | RemoveOp | ClearOp | ShapeOp


def tier_holder(worker_id: str, medium: Medium) -> str:
    """Who holds a worker's blocks of a tier in the index: the worker itself for GPU memory,
    ``"{worker} {medium}"`` for a tier below it (a space: no worker id has one, they are
    subject tokens). Each holder has its own blocks, slot and shape; the worker's event ids
    cover all of them."""
    return worker_id if medium == GPU else f"{worker_id} {medium}"


def holders(worker_id: str) -> tuple[str, ...]:
    """The worker and its lower tiers, as index holders."""
    return (worker_id, *(tier_holder(worker_id, m) for m in OFFLOAD_MEDIA))


def worker_of(holder: str) -> str:
    """The worker a holder belongs to."""
    return holder.split(" ", 1)[0]


def legacy(batch: KvEventBatch) -> bool:
    """A batch of engine hashes (versions 1-2) this index cannot place."""
    return batch.v < KV_BATCH_VERSION


def ops_of(batch: KvEventBatch) -> list[IndexOp]:
    """The ops of a version-3 batch, in order."""
    wid = batch.worker_id
    ops: list[IndexOp] = []
    for ev in batch.events:
        if isinstance(ev, BlockStored):
            if ev.block_hashes:
                ops.append(StoreOp(tier_holder(wid, ev.medium), ev.block_hashes))
        elif isinstance(ev, BlockRemoved):
            if ev.block_hashes:
                ops.append(RemoveOp(tier_holder(wid, ev.medium), ev.block_hashes))
        elif isinstance(ev, AllBlocksCleared):
            media = (GPU, *OFFLOAD_MEDIA) if ev.medium is None else (ev.medium,)
            ops.extend(ClearOp(tier_holder(wid, m)) for m in media)
        elif isinstance(ev, ShapeChanged):
            ops.append(ShapeOp(tier_holder(wid, ev.medium), ev.prefix_closed))
    return ops


def count_blocks(batch: KvEventBatch) -> tuple[int, int, int]:
    """(stored, removed, cleared) block events of a batch, for the indexer's counters."""
    stored = removed = cleared = 0
    for ev in batch.events:
        if isinstance(ev, BlockStored):
            stored += len(ev.block_hashes)
        elif isinstance(ev, BlockRemoved):
            removed += len(ev.block_hashes)
        elif isinstance(ev, AllBlocksCleared):
            cleared += 1
    return stored, removed, cleared


def fleet_hashes_for_prompt(
    token_ids: Sequence[int],
    block_size: int,
    lora_name: str | None = None,
    branch_blocks: int = DEFAULT_BRANCH_BLOCKS,
) -> list[int]:
    """What the router looks up for a request (the function workers hash their blocks with)."""
    return block_hashes(token_ids, block_size, hash_seed(lora_name), None, branch_blocks)
