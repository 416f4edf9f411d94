"""vLLM's KV cache events, as its ZMQ publisher sends them, decoded into ``schemas.kv_events``.

Pure: no vLLM import, no I/O. ``subscriber.py`` owns the sockets.

Data path::

    vLLM EngineCore ── ZmqEventPublisher ── PUB  [topic, seq: 8 B big-endian, msgpack payload]
                                         └─ ROUTER (replay) <- [b"", start seq: 8 B big-endian]
                     -> [b"", topic, seq, payload] ... [b"", b"", -1, b""]   (vLLM 0.26 and later)
                     -> [b"", seq, payload] ... [b"", -1, b""]               (before 0.26)

Which release changed what is in ``versions.py``.

**Payload.** msgspec-encoded ``KVEventBatch(ts, events, data_parallel_rank)``. The batch is
positional (``array_like``: ``[ts, events, dp_rank]``) in every release; the events were positional
up to 0.23 and are maps from 0.24. This decoder accepts both forms at both levels:

- positional: each event ``["BlockStored", block_hashes, parent_block_hash, token_ids,
  block_size, lora_id, medium, ...]`` (the tag first, then the fields in declaration order);
- maps: each event ``{"type": "BlockStored", "block_hashes": ..., ...}``; ``omit_defaults``
  drops fields left at their default (and a map-encoded batch would be read as well).

Fields are read by position (arrays) or by name (maps) against the union of every version's
fields, in vLLM's declaration order (``_STORED_FIELDS``...). Trailing fields a version did not
have (older: no ``medium``, ``data_parallel_rank``, ``lora_name``) read as absent; fields a newer
version appends are ignored. The required ones are the first four of ``BlockStored``, the first of
``BlockRemoved`` and ``ts`` + ``events`` of the batch. An unknown event type is skipped and counted.

**Block hashes** are vLLM's own and stay opaque: the indexer recomputes the fleet's hashes from
``token_ids`` (``router/kv/translate.py``). Our wire keeps engine hashes as unsigned 64-bit ints
(the index packs them as big-endian u64), so ``engine_block_hash`` normalizes:

- an int is taken modulo 2**64 (early vLLM hashed with Python's ``hash()``, which is signed);
- bytes (current vLLM: 32-byte sha256 digests) are read big-endian and truncated to their low 64
  bits, i.e. the **last 8 bytes**. That is exactly what vLLM itself sends when started with
  ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`` (``maybe_convert_block_hash``), so a worker gives the
  same ints whichever mode its vLLM runs in.

**Tiers.** ``medium`` (0.10.2+) names the tier: ``GPU`` (or absent), ``CPU`` (vLLM's native CPU
offloading, LMCache's host memory) and ``DISK`` keep it (case-insensitive), so the index knows a
block in host memory (``schemas.kv_events``); a medium we do not know is skipped. Hybrid models
report one KV cache group per ``group_idx``; only ``kv_group`` (default 0) is kept, and events
without a group are kept. LoRA: vLLM's ``lora_name`` is used when sent; older versions only send
``lora_id``, which is looked up in the adapters the worker loaded (an id we do not know: the event
is skipped, as its blocks could not be hashed like the router hashes that adapter's prompts).
``extra_keys`` (0.17+): a block whose hash also covers multimodal inputs, a cache salt or prompt
embeddings cannot be matched from token ids, so an event with any extra key besides its LoRA name is
skipped.

**Sequence numbers** start at 0 and grow by one per batch. ``SequenceTracker`` classifies each
received number: the next one, a gap (missing ``expected .. seq-1``: ask the replay socket), an
old one (a duplicate: drop), or 0 after later ones (the publisher restarted: its cache is new).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import msgspec

from schemas.kv_events import (
    GPU,
    OFFLOAD_MEDIA,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvCacheEvent,
    Medium,
)

U64_MASK = (1 << 64) - 1
REPLAY_END_SEQ = -1  # vLLM's ZmqEventPublisher.END_SEQ, sent after the last replayed batch

# Every field vLLM has declared, in declaration order (positional decoding depends on it).
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "lookahead_token_ids",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx", "locality", "ownership")
_CLEARED_FIELDS: tuple[str, ...] = ()
_BATCH_FIELDS = ("ts", "events", "data_parallel_rank")
_REQUIRED = {"BlockStored": 4, "BlockRemoved": 1, "AllBlocksCleared": 0}
_EVENT_FIELDS = {
    "BlockStored": _STORED_FIELDS,
    "BlockRemoved": _REMOVED_FIELDS,
    "AllBlocksCleared": _CLEARED_FIELDS,
}
_TAG_FIELD = "type"  # msgspec's default tag_field, used by vLLM's tagged union

_decoder = msgspec.msgpack.Decoder()


class VllmKvDecodeError(ValueError):
    """A frame or payload that is not vLLM's KV event wire format."""


@dataclass(frozen=True, slots=True)
class DecodeOptions:
    """What to keep of vLLM's events (see the module docstring, "Filters")."""

    lora_names: Mapping[int, str] = field(default_factory=dict)  # vLLM lora_int_id -> name
    kv_group: int = 0  # the KV cache group (``group_idx``) that is the prefix cache


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    ts_s: float  # vLLM's wall clock when the batch was made
    data_parallel_rank: int | None
    events: tuple[KvCacheEvent, ...]
    skipped: int = 0  # events of other media or groups, of unknown LoRA ids or unknown types


def engine_block_hash(raw: object) -> int:
    """An engine block hash as an unsigned 64-bit int (ints mod 2**64, bytes: last 8 bytes)."""
    if isinstance(raw, bool):
        raise VllmKvDecodeError(f"block hash is a bool: {raw!r}")
    if isinstance(raw, int):
        return raw & U64_MASK
    if isinstance(raw, bytes | bytearray | memoryview):
        return int.from_bytes(bytes(raw)[-8:], "big")
    raise VllmKvDecodeError(f"block hash of type {type(raw).__name__}")


def decode_batch(payload: bytes, options: DecodeOptions | None = None) -> DecodedBatch:
    """Decode one msgpack ``KVEventBatch`` payload (either encoding) into our events."""
    opts = options or DecodeOptions()
    try:
        raw = _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise VllmKvDecodeError(f"not msgpack: {exc}") from exc
    batch = _fields(raw, _BATCH_FIELDS, 2, "batch")
    events_raw = batch["events"]
    if not isinstance(events_raw, list):
        raise VllmKvDecodeError("batch events is not an array")
    events: list[KvCacheEvent] = []
    skipped = 0
    for ev in events_raw:
        out = _event(ev, opts)
        if out is None:
            skipped += 1
        else:
            events.append(out)
    return DecodedBatch(
        ts_s=_number(batch["ts"], "ts"),
        data_parallel_rank=_opt_int(batch.get("data_parallel_rank"), "data_parallel_rank"),
        events=tuple(events),
        skipped=skipped,
    )


def _fields(raw: object, names: Sequence[str], required: int, what: str) -> dict[str, Any]:
    """Positional array or map -> {name: value} over ``names`` (absent names left out)."""
    if isinstance(raw, list):
        values = dict(zip(names, raw, strict=False))
    elif isinstance(raw, dict):
        values = {n: raw[n] for n in names if n in raw}
    else:
        raise VllmKvDecodeError(f"{what} is neither an array nor a map: {type(raw).__name__}")
    missing = [n for n in names[:required] if n not in values]
    if missing:
        raise VllmKvDecodeError(f"{what} lacks {', '.join(missing)}")
    return values


def _event(raw: object, opts: DecodeOptions) -> KvCacheEvent | None:
    body: object
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        tag, body = raw[0], raw[1:]
    elif isinstance(raw, dict) and isinstance(raw.get(_TAG_FIELD), str):
        tag, body = raw[_TAG_FIELD], raw
    else:
        raise VllmKvDecodeError(f"event without a type tag: {raw!r:.80}")
    names = _EVENT_FIELDS.get(tag)
    if names is None:
        return None  # a type this decoder does not know (a newer vLLM): skipped, counted
    f = _fields(body, names, _REQUIRED[tag], tag)
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    medium = _medium(f)
    if medium is None or not _kept(f, opts):
        return None
    hashes = tuple(engine_block_hash(h) for h in _list(f["block_hashes"], "block_hashes"))
    if tag == "BlockRemoved":
        return BlockRemoved(hashes, medium)
    known, lora = _lora_name(f, opts)
    if not known or not _hashed_from_tokens(f.get("extra_keys"), lora):
        return None
    parent = f["parent_block_hash"]
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=None if parent is None else engine_block_hash(parent),
        token_ids=tuple(_int(t, "token id") for t in _list(f["token_ids"], "token_ids")),
        block_size=_int(f["block_size"], "block_size"),
        lora_name=lora,
        medium=medium,
    )


def _medium(f: Mapping[str, Any]) -> Medium | None:
    """The event's tier (None: one we do not know)."""
    medium = f.get("medium")
    if medium is None:
        return GPU
    name = str(medium).upper()
    return next((m for m in _MEDIA if m == name), None)


_MEDIA: tuple[Medium, ...] = (GPU, *OFFLOAD_MEDIA)


def _kept(f: Mapping[str, Any], opts: DecodeOptions) -> bool:
    group = f.get("group_idx")
    return group is None or group == opts.kv_group


def _lora_name(f: Mapping[str, Any], opts: DecodeOptions) -> tuple[bool, str | None]:
    """(known, adapter name): the event's ``lora_name``, else its ``lora_id`` looked up."""
    name = f.get("lora_name")
    if isinstance(name, str) and name:
        return True, name
    lora_id = f.get("lora_id")
    if lora_id is None or lora_id == 0:  # vLLM: no LoRA request (lora_int_id starts at 1)
        return True, None
    name = opts.lora_names.get(_int(lora_id, "lora_id"))
    return name is not None, name


def _hashed_from_tokens(extra_keys: object, lora: str | None) -> bool:
    """True when no block's hash covers more than its tokens and the LoRA name."""
    if not extra_keys:
        return True
    for entry in _list(extra_keys, "extra_keys"):
        if entry and any(key != lora for key in _list(entry, "extra_keys entry")):
            return False
    return True


def _list(v: object, what: str) -> list[Any]:
    if not isinstance(v, list):
        raise VllmKvDecodeError(f"{what} is not an array")
    return v


def _int(v: object, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise VllmKvDecodeError(f"{what} is not an int: {v!r:.40}")
    return v


def _opt_int(v: object, what: str) -> int | None:
    return None if v is None else _int(v, what)


def _number(v: object, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise VllmKvDecodeError(f"{what} is not a number")
    return float(v)


# ------------------------------------------------------------------------------------ frames
def parse_pub_frames(frames: Sequence[bytes]) -> tuple[int, bytes]:
    """``[topic, seq, payload]`` from the PUB socket -> ``(seq, payload)``."""
    if len(frames) != 3 or len(frames[1]) != 8:
        raise VllmKvDecodeError(f"PUB message of {len(frames)} frames is not [topic, seq, payload]")
    return int.from_bytes(frames[1], "big", signed=True), bytes(frames[2])


def parse_replay_frames(frames: Sequence[bytes]) -> tuple[int, bytes] | None:
    """A replay reply as a DEALER receives it -> ``(seq, payload)``, or None for the end marker.

    vLLM 0.26 and later: ``[b"", topic, seq, payload]``, ending with ``[b"", b"", -1, b""]``;
    before: ``[b"", seq, payload]``, ending with ``[b"", -1, b""]`` (the ROUTER's empty
    delimiter first in both)."""
    if len(frames) not in (3, 4) or frames[0]:
        raise VllmKvDecodeError(
            f"replay reply of {len(frames)} frames is not [b'', (topic,) seq, payload]"
        )
    seq_frame, payload = frames[-2], frames[-1]
    if len(seq_frame) != 8:
        raise VllmKvDecodeError(f"replay sequence number of {len(seq_frame)} bytes, not 8")
    seq = int.from_bytes(seq_frame, "big", signed=True)
    if seq == REPLAY_END_SEQ or not payload:
        return None
    return seq, bytes(payload)


def replay_request(start_seq: int) -> list[bytes]:
    """What a DEALER sends to vLLM's ROUTER: the empty delimiter, then the 8-byte start seq."""
    return [b"", start_seq.to_bytes(8, "big")]


def fill_gap(
    replies: Sequence[tuple[int, bytes]], start: int, stop: int
) -> list[tuple[int, bytes]] | None:
    """The replayed batches ``start .. stop-1`` in order, or None if any is missing (the
    publisher's replay buffer no longer holds it). Replies outside the range are ignored."""
    by_seq = {seq: payload for seq, payload in replies if start <= seq < stop}
    if len(by_seq) != stop - start:
        return None
    return [(seq, by_seq[seq]) for seq in range(start, stop)]


# ---------------------------------------------------------------------------------- sequence
class SeqKind(Enum):
    NEXT = "next"  # the expected number: apply it
    GAP = "gap"  # later than expected: ``missing_from .. seq-1`` were lost
    DUPLICATE = "duplicate"  # already applied: drop it
    RESTART = "restart"  # 0 after later numbers: the publisher (vLLM) started again


@dataclass(frozen=True, slots=True)
class SeqVerdict:
    kind: SeqKind
    missing_from: int = 0  # first lost sequence number (GAP only)


class SequenceTracker:
    """Expected next sequence number of one publisher (the first one vLLM sends is 0)."""

    def __init__(self) -> None:
        self.expected = 0

    def check(self, seq: int) -> SeqVerdict:
        if seq == self.expected:
            return SeqVerdict(SeqKind.NEXT)
        if seq > self.expected:
            return SeqVerdict(SeqKind.GAP, self.expected)
        if seq == 0:
            return SeqVerdict(SeqKind.RESTART)
        return SeqVerdict(SeqKind.DUPLICATE)

    def applied(self, seq: int) -> None:
        """``seq`` was applied (or given up on): expect ``seq + 1`` next."""
        self.expected = seq + 1
