"""Mirrors of vLLM's KV event structs (``vllm/distributed/kv_events.py``), one set per wire
generation, used to build golden payloads byte for byte as vLLM builds them; and, where vLLM is
installed, the check that the mirrors (and our decoder) still match vLLM's real classes.

Generations (field order, struct options as vLLM declares them):

- ``V1``: the first V1 publisher. ``array_like=True``; ``BlockStored(block_hashes: list[int],
  parent_block_hash, token_ids, block_size, lora_id)``, ``BlockRemoved(block_hashes)``;
  ``EventBatch(ts, events)``.
- ``V2``: still ``array_like``; ``medium`` appended to both events, ``data_parallel_rank`` to the
  batch, hashes ``ExternalBlockHash = bytes | int``.
- ``V3``: current vLLM. No ``array_like`` (maps, the tag under ``"type"``); ``BlockStored`` gains
  ``lora_name``, ``extra_keys``, ``group_idx``, ``kv_cache_spec_kind``,
  ``kv_cache_spec_sliding_window``; ``BlockRemoved`` gains ``group_idx``.

vLLM's events use ``tag=True``, i.e. the tag is the class's ``__qualname__``; vLLM's classes are
module-level, so the tags are ``"BlockStored"`` etc. The mirrors of three generations cannot all
be module-level classes of those names in one module, so they spell the same tag out
(``tag="BlockStored"``): the encoding is identical, and ``test_mirror_matches_installed_vllm``
compares the bytes with vLLM's own classes when vLLM is installed.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from workers.engines.vllm import kv_events

# ---------------------------------------------------------------------------------- V1


class EventBatchV1(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class KVCacheEventV1(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStoredV1(KVCacheEventV1, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class BlockRemovedV1(KVCacheEventV1, tag="BlockRemoved"):
    block_hashes: list[int]


class AllBlocksClearedV1(KVCacheEventV1, tag="AllBlocksCleared"):
    pass


class KVEventBatchV1(EventBatchV1):
    events: list[BlockStoredV1 | BlockRemovedV1 | AllBlocksClearedV1]


# ---------------------------------------------------------------------------------- V2
ExternalBlockHash = bytes | int


class EventBatchV2(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEventV2(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStoredV2(KVCacheEventV2, tag="BlockStored"):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemovedV2(KVCacheEventV2, tag="BlockRemoved"):
    block_hashes: list[ExternalBlockHash]
    medium: str | None


class AllBlocksClearedV2(KVCacheEventV2, tag="AllBlocksCleared"):
    pass


class KVEventBatchV2(EventBatchV2):
    events: list[BlockStoredV2 | BlockRemovedV2 | AllBlocksClearedV2]


# ---------------------------------------------------------------------------------- V3


class EventBatchV3(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEventV3(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStoredV3(KVCacheEventV3, tag="BlockStored"):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemovedV3(KVCacheEventV3, tag="BlockRemoved"):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None


class AllBlocksClearedV3(KVCacheEventV3, tag="AllBlocksCleared"):
    pass


class KVEventBatchV3(EventBatchV3):
    events: list[BlockStoredV3 | BlockRemovedV3 | AllBlocksClearedV3]


MIRRORS: dict[str, dict[str, type[msgspec.Struct]]] = {
    "V1": {
        "BlockStored": BlockStoredV1,
        "BlockRemoved": BlockRemovedV1,
        "AllBlocksCleared": AllBlocksClearedV1,
        "KVEventBatch": KVEventBatchV1,
    },
    "V2": {
        "BlockStored": BlockStoredV2,
        "BlockRemoved": BlockRemovedV2,
        "AllBlocksCleared": AllBlocksClearedV2,
        "KVEventBatch": KVEventBatchV2,
    },
    "V3": {
        "BlockStored": BlockStoredV3,
        "BlockRemoved": BlockRemovedV3,
        "AllBlocksCleared": AllBlocksClearedV3,
        "KVEventBatch": KVEventBatchV3,
    },
}


def encode(batch: msgspec.Struct) -> bytes:
    """As vLLM's publisher thread does: ``msgspec.msgpack.Encoder().encode(batch)``."""
    return msgspec.msgpack.Encoder().encode(batch)


def stored_v3(
    hashes: list[ExternalBlockHash],
    parent: ExternalBlockHash | None,
    tokens: list[int],
    block_size: int,
    **rest: Any,
) -> BlockStoredV3:
    base: dict[str, Any] = {"lora_id": None, "medium": "GPU", "lora_name": None}
    return BlockStoredV3(hashes, parent, tokens, block_size, **(base | rest))


# ------------------------------------------------- fidelity against vLLM (when installed)
def _names(cls: type[msgspec.Struct]) -> tuple[str, ...]:
    return tuple(f.name for f in msgspec.structs.fields(cls))


def _options(cls: type[msgspec.Struct]) -> tuple[object, ...]:
    c = cls.__struct_config__
    return (c.array_like, c.omit_defaults, c.tag_field, c.tag)


def _prefix_compatible(theirs: tuple[str, ...], ours: tuple[str, ...]) -> bool:
    n = min(len(theirs), len(ours))
    return theirs[:n] == ours[:n]


def test_decoder_field_orders_match_installed_vllm() -> None:
    real = pytest.importorskip("vllm.distributed.kv_events")
    assert _prefix_compatible(_names(real.BlockStored), kv_events._STORED_FIELDS)
    assert _prefix_compatible(_names(real.BlockRemoved), kv_events._REMOVED_FIELDS)
    assert _prefix_compatible(_names(real.KVEventBatch), kv_events._BATCH_FIELDS)


def test_mirror_matches_installed_vllm() -> None:
    """One mirror generation has vLLM's exact fields and options and encodes the same bytes."""
    real = pytest.importorskip("vllm.distributed.kv_events")
    match = [
        gen
        for gen, m in MIRRORS.items()
        if all(
            _names(getattr(real, name)) == _names(cls)
            and _options(getattr(real, name)) == _options(cls)
            for name, cls in m.items()
        )
    ]
    assert match, "installed vLLM has a KV event wire format no mirror knows: add one"
    m = MIRRORS[match[0]]
    sample: dict[str, Any] = {
        "block_hashes": [11, 12],
        "parent_block_hash": 10,
        "token_ids": [1, 2, 3, 4],
        "block_size": 2,
    }
    fields = _names(m["BlockStored"])
    kwargs = {n: sample.get(n) for n in fields}
    removed = {n: ([11] if n == "block_hashes" else None) for n in _names(m["BlockRemoved"])}
    batch_kw: dict[str, Any] = {"ts": 1.5}
    ours = m["KVEventBatch"](
        events=[m["BlockStored"](**kwargs), m["BlockRemoved"](**removed)], **batch_kw
    )
    theirs = real.KVEventBatch(
        events=[real.BlockStored(**kwargs), real.BlockRemoved(**removed)], **batch_kw
    )
    assert encode(theirs) == encode(ours)
    decoded = kv_events.decode_batch(encode(theirs))
    assert [type(e).__name__ for e in decoded.events] == ["BlockStored", "BlockRemoved"]
