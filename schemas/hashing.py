"""The fleet's block hashing: one function used by the frontend, the indexer and the mocker.

Only full blocks are hashed. Each block's token ids are packed as little-endian u32 and hashed with
XXH3-64 seeded by ``hash_seed(lora_name, namespace)``, giving ``local[i]``. Hashes are chained so a
block's hash names its whole prefix::

    seq[0] = local[0]
    seq[i] = XXH3-64(le_u64(seq[i-1]) || le_u64(local[i]), seed)

Two prompts share ``seq[i]`` exactly when they share their first ``(i+1) * block_size`` tokens
(and LoRA / namespace). Engines with their own hashes (vLLM) are mapped onto these by the indexer.
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


def chain_hash(parent: int | None, local: int, seed: int = 0) -> int:
    if parent is None:
        return local
    return _xxh3(_PAIR.pack(parent, local), seed)


def block_hashes(
    token_ids: Sequence[int], block_size: int, seed: int = 0, parent: int | None = None
) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` (continuing after ``parent``)."""
    out: list[int] = []
    prev = parent
    for local in local_block_hashes(token_ids, block_size, seed):
        prev = chain_hash(prev, local, seed)
        out.append(prev)
    return out
