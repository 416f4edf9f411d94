"""Cut a worker's KV events into batches that fit a NATS message.

A full-cache republish (``kv_resync``) or a long prompt's stored run can hold tens of thousands
of blocks with their token ids, past NATS's default 1 MB payload limit. ``split_events`` keeps
the order of events and cuts them so that no batch carries more than ``max_tokens`` token ids
(or ``max_hashes`` block hashes): a long ``BlockStored`` becomes consecutive pieces, each
piece's parent the last block of the one before, which is exactly the same chain to the indexer.
Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from schemas.kv_events import BlockRemoved, BlockStored, KvCacheEvent

MAX_TOKENS_PER_BATCH = 65_536
MAX_HASHES_PER_BATCH = 16_384


def _cost(ev: KvCacheEvent) -> tuple[int, int]:
    if isinstance(ev, BlockStored):
        return len(ev.token_ids), len(ev.block_hashes)
    if isinstance(ev, BlockRemoved):
        return 0, len(ev.block_hashes)
    return 0, 0


def _pieces(ev: BlockStored, max_blocks: int) -> list[BlockStored]:
    out: list[BlockStored] = []
    parent = ev.parent_block_hash
    for start in range(0, len(ev.block_hashes), max_blocks):
        hashes = ev.block_hashes[start : start + max_blocks]
        tokens = ev.token_ids[start * ev.block_size : (start + len(hashes)) * ev.block_size]
        out.append(BlockStored(hashes, parent, tokens, ev.block_size, ev.lora_name, ev.medium))
        parent = hashes[-1]
    return out


def _removed_pieces(ev: BlockRemoved, max_blocks: int) -> list[BlockRemoved]:
    return [
        BlockRemoved(ev.block_hashes[i : i + max_blocks], ev.medium)
        for i in range(0, len(ev.block_hashes), max_blocks)
    ]


def split_events(
    events: Sequence[KvCacheEvent],
    max_tokens: int = MAX_TOKENS_PER_BATCH,
    max_hashes: int = MAX_HASHES_PER_BATCH,
) -> list[list[KvCacheEvent]]:
    """Consecutive groups of ``events`` (long runs cut), each within both limits."""
    flat: list[KvCacheEvent] = []
    for ev in events:
        if isinstance(ev, BlockStored) and ev.block_hashes:
            per_block = max(len(ev.token_ids) // len(ev.block_hashes), 1)
            limit = max(1, min(max_tokens // per_block, max_hashes))
            flat.extend(_pieces(ev, limit) if len(ev.block_hashes) > limit else [ev])
        elif isinstance(ev, BlockRemoved) and len(ev.block_hashes) > max_hashes:
            flat.extend(_removed_pieces(ev, max_hashes))
        else:
            flat.append(ev)
    batches: list[list[KvCacheEvent]] = []
    current: list[KvCacheEvent] = []
    tokens = hashes = 0
    for ev in flat:
        t, h = _cost(ev)
        if current and (tokens + t > max_tokens or hashes + h > max_hashes):
            batches.append(current)
            current, tokens, hashes = [], 0, 0
        current.append(ev)
        tokens += t
        hashes += h
    if current:
        batches.append(current)
    return batches
