"""Mirrors of vLLM's KV event structs (``vllm/distributed/kv_events.py``), one set per wire
generation, used to build payloads byte for byte as vLLM builds them in the unit and integration
tests, and to read them as the worker reads its vLLM's (``kv_events.BatchReader``).
``tests/vllm_compat`` checks each mirror against the real classes of the release it names
(fetched from PyPI): same fields, same struct options, same bytes.

Generations (field order, struct options as vLLM declares them; ``versions.py`` has the table):

- ``V1`` = vLLM 0.10.0-0.10.1: ``array_like=True`` events; ``BlockStored(block_hashes,
  parent_block_hash, token_ids, block_size, lora_id)``, ``BlockRemoved(block_hashes)``;
  ``KVEventBatch(ts, events, data_parallel_rank=None)``, an array too.
- ``V2`` = vLLM 0.10.2-0.13: still ``array_like``; ``medium`` appended to both events, hashes
  ``ExternalBlockHash = bytes | int``.
- ``V3`` = vLLM 0.24-0.25: events are maps (the tag under ``"type"``), the batch is still an
  array; ``BlockStored`` has ``lora_name``, ``extra_keys``, ``group_idx``, ``kv_cache_spec_kind``,
  ``kv_cache_spec_sliding_window``; ``BlockRemoved`` has ``group_idx``. Later releases append
  defaulted fields (``locality``, ``ownership``...) that ``omit_defaults`` leaves off the wire.

vLLM's events use ``tag=True``, i.e. the tag is the class's ``__qualname__``; vLLM's classes are
module-level, so the tags are ``"BlockStored"`` etc. The mirrors of three generations cannot all
be module-level classes of those names in one module, so they spell the same tag out
(``tag="BlockStored"``): the encoding is identical.
"""

from __future__ import annotations

from typing import Any

import msgspec

# ---------------------------------------------------------------------------------- V1


class EventBatchV1(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


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


class EventBatchV3(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
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
# (against the releases the mirrors name: tests/vllm_compat)
MIRROR_RELEASES = {"V1": "0.10.0", "V2": "0.11.2", "V3": "0.25.1"}


def struct_names(cls: type[msgspec.Struct]) -> tuple[str, ...]:
    return tuple(f.name for f in msgspec.structs.fields(cls))


def struct_options(cls: type[msgspec.Struct]) -> tuple[object, ...]:
    c = cls.__struct_config__
    return (c.array_like, c.omit_defaults, c.tag_field, c.tag)
