"""The fleet's block hashing: one function used by the frontend, the worker and the indexer.

Only full blocks are hashed. Each block's token ids are packed as little-endian u32 and hashed with
XXH3-64 seeded by ``hash_seed(lora_name, namespace)``, giving ``local[i]``. Hashes are chained so a
block's hash names its whole prefix, and the top byte of every hash is its **branch tag**, which
says on which shard of the prefix index the block lives (``router/kv/shards.py``)::

    raw[0] = local[0]
    raw[i] = XXH3-64(le_u64(seq[i-1]) || le_u64(local[i]), seed)
    seq[i] = raw[i] with its top byte replaced by tag[i]

    tag[i] = depth i, for blocks above the branch point (i < branch_blocks - 1): "shallow"
           = SHALLOW_TAGS + top byte of raw[i] mod (256 - SHALLOW_TAGS), at the branch point
             (i == branch_blocks - 1)
           = tag[i-1] below it (a chain keeps its branch's tag)

So every block of the chains that share their first ``branch_blocks`` blocks carries one tag, and
a request's blocks are all found on the shard its branch tag names, in one round trip, without
anyone remembering where a block went: the shard of any block is read from its hash (Dynamo's
branch sharding, with the branch written into the hash instead of kept in a table). Shallow
blocks (tags below ``SHALLOW_TAGS``, the first ``branch_blocks - 1`` of a chain) belong to every
branch below them and are kept on every shard. ``branch_blocks`` (a worker setting, carried in its
registration like the block size) trades where routes of a shared prefix land against how many
blocks are written to every shard; hashes of different ``branch_blocks`` never match.

Two prompts share ``seq[i]`` exactly when they share their first ``(i+1) * block_size`` tokens
(and LoRA / namespace); 56 bits of a hash are the chain's (one collision among 10M blocks of one
branch has a probability under 1e-3, and costs a mis-estimated overlap, never a wrong answer).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence

import xxhash

_LE = sys.byteorder == "little"
_PAIR = struct.Struct("<QQ")
_xxh3 = xxhash.xxh3_64_intdigest

TAG_SHIFT = 56
LOW_MASK = (1 << TAG_SHIFT) - 1
SHALLOW_TAGS = 64  # tags below this are the depths of shallow blocks (so branch_blocks <= 64)
BRANCH_TAGS = 256 - SHALLOW_TAGS
DEFAULT_BRANCH_BLOCKS = 4
MAX_BRANCH_BLOCKS = SHALLOW_TAGS


def hash_seed(lora_name: str | None = None, namespace: str | None = None) -> int:
    """Seed folding the LoRA adapter and cache namespace in (0 for the base model)."""
    if not lora_name and not namespace:
        return 0
    return _xxh3(f"{namespace or ''}\x00{lora_name or ''}".encode())


def _pack_u32(tokens: Sequence[int]) -> bytes:
    arr = array("I", tokens)
    if not _LE:
        arr.byteswap()
    return arr.tobytes()


def local_block_hashes(token_ids: Sequence[int], block_size: int, seed: int = 0) -> list[int]:
    """Unchained hash of each full block."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    n_full = len(token_ids) // block_size
    if n_full == 0:
        return []
    packed = _pack_u32(token_ids[: n_full * block_size])
    step = block_size * 4
    return [_xxh3(packed[i * step : (i + 1) * step], seed) for i in range(n_full)]


def check_branch_blocks(branch_blocks: int) -> int:
    if not 1 <= branch_blocks <= MAX_BRANCH_BLOCKS:
        raise ValueError(f"branch_blocks must be in 1..{MAX_BRANCH_BLOCKS}, not {branch_blocks}")
    return branch_blocks


def chain_hash(
    parent: int | None, local: int, seed: int = 0, branch_blocks: int = DEFAULT_BRANCH_BLOCKS
) -> int:
    """The hash of the block after ``parent`` (None: a chain's first block) whose tokens hash
    to ``local``, tagged as the module docstring says."""
    if parent is None:
        raw, depth = local, 0
    else:
        raw = _xxh3(_PAIR.pack(parent, local), seed)
        ptag = parent >> TAG_SHIFT
        if ptag >= SHALLOW_TAGS:  # below the branch point: keep the branch's tag
            return (raw & LOW_MASK) | (ptag << TAG_SHIFT)
        depth = ptag + 1
    shallow = depth < branch_blocks - 1
    tag = depth if shallow else SHALLOW_TAGS + (raw >> TAG_SHIFT) % BRANCH_TAGS
    return (raw & LOW_MASK) | (tag << TAG_SHIFT)


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    seed: int = 0,
    parent: int | None = None,
    branch_blocks: int = DEFAULT_BRANCH_BLOCKS,
) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` (continuing after ``parent``)."""
    out: list[int] = []
    prev = parent
    for local in local_block_hashes(token_ids, block_size, seed):
        prev = chain_hash(prev, local, seed, branch_blocks)
        out.append(prev)
    return out


def branch_tag(block_hash: int) -> int:
    """The block's tag (below ``SHALLOW_TAGS``: a shallow block, kept on every shard)."""
    return block_hash >> TAG_SHIFT


def is_shallow(block_hash: int) -> bool:
    return block_hash >> TAG_SHIFT < SHALLOW_TAGS
