"""vLLM's KV cache events, as its ZMQ publisher sends them, read with the running vLLM's own
event structs and translated into ``schemas.kv_events``.

Pure: no vLLM import, no I/O. The structs come from the backend (``backend.py``: the installed
vLLM's ``vllm.distributed.kv_events.KVEventBatch``); ``subscriber.py`` owns the sockets.

Data path::

    vLLM EngineCore ── ZmqEventPublisher ── PUB  [topic, seq: 8 B big-endian, msgpack payload]
                                         └─ ROUTER (replay) <- [b"", start seq: 8 B big-endian]
                     -> [b"", topic, seq, payload] ... [b"", b"", -1, b""]   (vLLM 0.26 and later)
                     -> [b"", seq, payload] ... [b"", -1, b""]               (before 0.26)

Which release changed what is in ``versions.py``.

**Payload.** msgspec-encoded ``KVEventBatch(ts, events, data_parallel_rank)``, decoded by a
``msgspec.msgpack.Decoder`` typed with the publishing release's own ``KVEventBatch``: the worker
imports the very vLLM that publishes, so its structs know the release's encoding (positional or
map events, fields appended later) and validate every value's type. ``translate`` then reads the
objects by field name (``getattr``, absent fields as None: a field a release did not have) and the
event's type by its msgspec tag. A payload the release's structs refuse raises
``VllmKvDecodeError``; an event type the translation does not know is skipped and counted.

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


class VllmKvDecodeError(ValueError):
    """A frame or payload that is not vLLM's KV event wire format."""


@dataclass(frozen=True, slots=True)
class DecodeOptions:
    """What to keep of vLLM's events (see the module docstring, "Tiers")."""

    lora_names: Mapping[int, str] = field(default_factory=dict)  # vLLM lora_int_id -> name
    kv_group: int = 0  # the KV cache group (``group_idx``) that is the prefix cache


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    ts_s: float  # vLLM's wall clock when the batch was made
    data_parallel_rank: int | None
    events: tuple[KvCacheEvent, ...]
    skipped: int = 0  # events of other media or groups, of unknown LoRA ids or unknown types


class BatchReader:
    """Reads one vLLM release's payloads: ``batch_type`` is its ``KVEventBatch`` struct."""

    def __init__(self, batch_type: type[Any], options: DecodeOptions | None = None) -> None:
        self._decoder = msgspec.msgpack.Decoder(batch_type)
        self.options = options or DecodeOptions()

    def decode(self, payload: bytes) -> DecodedBatch:
        try:
            batch = self._decoder.decode(payload)
        except msgspec.DecodeError as exc:  # a ValidationError is one too
            raise VllmKvDecodeError(f"not a KV event batch of this vLLM: {exc}") from exc
        return translate(batch, self.options)


def engine_block_hash(raw: object) -> int:
    """An engine block hash as an unsigned 64-bit int (ints mod 2**64, bytes: last 8 bytes)."""
    if isinstance(raw, bool):
        raise VllmKvDecodeError(f"block hash is a bool: {raw!r}")
    if isinstance(raw, int):
        return raw & U64_MASK
    if isinstance(raw, bytes | bytearray | memoryview):
        return int.from_bytes(bytes(raw)[-8:], "big")
    raise VllmKvDecodeError(f"block hash of type {type(raw).__name__}")


def translate(batch: Any, opts: DecodeOptions) -> DecodedBatch:
    """A decoded ``KVEventBatch`` (vLLM's struct) -> our events, filtered by ``opts``."""
    events: list[KvCacheEvent] = []
    skipped = 0
    for ev in batch.events:
        out = _event(ev, opts)
        if out is None:
            skipped += 1
        else:
            events.append(out)
    return DecodedBatch(
        ts_s=float(batch.ts),
        data_parallel_rank=getattr(batch, "data_parallel_rank", None),
        events=tuple(events),
        skipped=skipped,
    )


def event_type(ev: object) -> str:
    """An event's type: its msgspec tag (vLLM's ``tag=True`` is the class name)."""
    config = getattr(type(ev), "__struct_config__", None)
    tag = getattr(config, "tag", None)
    return tag if isinstance(tag, str) else type(ev).__name__


def _event(ev: Any, opts: DecodeOptions) -> KvCacheEvent | None:
    kind = event_type(ev)
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    if kind not in ("BlockStored", "BlockRemoved"):
        return None  # a type this adapter does not translate: skipped, counted
    medium = _medium(getattr(ev, "medium", None))
    group = getattr(ev, "group_idx", None)
    if medium is None or not (group is None or group == opts.kv_group):
        return None
    hashes = tuple(engine_block_hash(h) for h in ev.block_hashes)
    if kind == "BlockRemoved":
        return BlockRemoved(hashes, medium)
    known, lora = _lora_name(ev, opts)
    if not known or not _hashed_from_tokens(getattr(ev, "extra_keys", None), lora):
        return None
    parent = ev.parent_block_hash
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=None if parent is None else engine_block_hash(parent),
        token_ids=tuple(ev.token_ids),
        block_size=int(ev.block_size),
        lora_name=lora,
        medium=medium,
    )


def _medium(medium: object) -> Medium | None:
    """The event's tier (None: one we do not know)."""
    if medium is None:
        return GPU
    name = str(medium).upper()
    return next((m for m in _MEDIA if m == name), None)


_MEDIA: tuple[Medium, ...] = (GPU, *OFFLOAD_MEDIA)


def _lora_name(ev: Any, opts: DecodeOptions) -> tuple[bool, str | None]:
    """(known, adapter name): the event's ``lora_name``, else its ``lora_id`` looked up."""
    name = getattr(ev, "lora_name", None)
    if isinstance(name, str) and name:
        return True, name
    lora_id = getattr(ev, "lora_id", None)
    if not lora_id:  # None or 0, vLLM: no LoRA request (lora_int_id starts at 1)
        return True, None
    name = opts.lora_names.get(int(lora_id))
    return name is not None, name


def _hashed_from_tokens(extra_keys: Sequence[Any] | None, lora: str | None) -> bool:
    """True when no block's hash covers more than its tokens and the LoRA name."""
    return not extra_keys or all(
        not entry or all(key == lora for key in entry) for entry in extra_keys
    )


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
