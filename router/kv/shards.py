"""Which shard of the prefix index holds a block, and which one a request is routed on. Pure.

Every block hash carries its branch tag in its top byte (``schemas.hashing``): the blocks of the
chains that share their first ``branch_blocks`` blocks carry one tag, and tag ``t`` lives on shard
``(t - SHALLOW_TAGS) % n``. A request is routed on the shard of its first tagged block, where all
of its blocks are. Shallow blocks (above the branch point) belong to every branch below them and
are kept on every shard, so a prompt too short to reach its branch point can be routed on any
shard: it is spread by its last block. With one shard everything is shard 0.

Cost, as the sharded benchmarks measure it: a route reads one shard whatever the count (its Redis
CPU is the same with 1 and N shards); a block event is written to one shard (a shallow one to
all, which the first blocks of a chain are); so ingest and routes both grow with the shards, as
long as the traffic's branches spread (a fleet whose every prompt shares its first
``branch_blocks`` blocks routes on one shard: raise ``--kv-branch-blocks`` past the shared
prefix).
"""

from __future__ import annotations

from collections.abc import Sequence

from schemas.hashing import SHALLOW_TAGS, TAG_SHIFT


def shard_of_block(block_hash: int, n_shards: int) -> int:
    """The shard of a tagged block; -1 for a shallow block (every shard)."""
    tag = block_hash >> TAG_SHIFT
    if tag < SHALLOW_TAGS:
        return -1
    return (tag - SHALLOW_TAGS) % n_shards


def route_shard(block_hashes: Sequence[int], n_shards: int) -> int:
    """The shard a request with these blocks is routed on."""
    if n_shards == 1 or not block_hashes:
        return 0
    for h in block_hashes:
        tag = h >> TAG_SHIFT
        if tag >= SHALLOW_TAGS:
            return (tag - SHALLOW_TAGS) % n_shards
    return block_hashes[-1] % n_shards


def split_by_shard(block_hashes: Sequence[int], n_shards: int) -> dict[int, list[int]]:
    """The blocks each shard holds (shallow ones on every shard), in their order."""
    if n_shards == 1:
        return {0: list(block_hashes)}
    out: dict[int, list[int]] = {}
    for h in block_hashes:
        tag = h >> TAG_SHIFT
        if tag < SHALLOW_TAGS:
            for s in range(n_shards):
                out.setdefault(s, []).append(h)
        else:
            out.setdefault((tag - SHALLOW_TAGS) % n_shards, []).append(h)
    return out
