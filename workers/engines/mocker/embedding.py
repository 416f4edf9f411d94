"""The mocker's embeddings: a deterministic unit vector per prompt. Pure.

The same token ids always give the same vector, and different ones (almost surely) a different
one: component ``j`` is a hash of (the prompt's tokens, ``j``) mapped to [-1, 1), and the vector
is scaled to unit length. ``dimensions`` keeps the first components and scales again (the
Matryoshka way embedding models shorten their vectors).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence

import xxhash


def embedding(
    token_ids: Sequence[int], size: int, dimensions: int | None = None
) -> tuple[float, ...]:
    n = size if dimensions is None else dimensions
    if not 0 < n <= size:
        raise ValueError(f"dimensions must be in [1, {size}], got {n}")
    seed = xxhash.xxh3_64_intdigest(array("q", token_ids).tobytes())
    digest = xxhash.xxh3_64_intdigest
    values = [digest(j.to_bytes(4, "little"), seed) / 2**63 - 1.0 for j in range(n)]
    norm = math.sqrt(sum(x * x for x in values)) or 1.0
    return tuple(x / norm for x in values)
