"""Turn a worker's ``KvEventBatch`` into index operations on the fleet's own block hashes.

Engines report their own block hashes (vLLM's are opaque to us). For every stored run of blocks the
translator recomputes the fleet's chained hashes from the token ids, continuing from the fleet
hash of the engine's parent block, and remembers engine hash -> fleet hash per worker so later
removals can be applied. The mapping is a cache of what the index itself stores: after a restart
the shell refills it from the index (``preload``).

Engines that hash like the fleet (the mocker uses ``schemas.hashing``) need no recomputation.
A worker earns that status when one whole stored run recomputes to exactly its engine hashes;
from then on each run is only spot-checked (its first block recomputed from its first
``block_size`` token ids and the parent) and its engine hashes are used as they are — the op then
carries the same tuple as engine and fleet hashes, which the Redis index stores once. A failed
spot check recomputes that run in full and takes the status away until a run matches again.
(The check cannot prove the rest of a run: an engine whose first blocks hash like ours but whose
later ones do not would be indexed by its own hashes. Chained 64-bit hashes make that a bug, not a
coincidence.)

The indexer decodes batches as ``WireKvBatch`` (the wire layout of ``KvEventBatch`` with the token
ids left encoded, ``msgspec.Raw``): building a Python int per token costs more than hashing them,
and a spot check needs only the first block's. ``translate`` takes either type.

Pure: no I/O. ``translate`` returns the ops and the mapping changes; a missing parent (an event
lost before this one) or token ids that cannot be read are reported so the caller can heal the
worker (drop its entries, ask it to publish its cache again).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from router.kv.shape import UNKNOWN, WorkerShape
from schemas import WireDecodeError
from schemas.hashing import block_hashes, chain_hash, hash_seed, local_block_hashes
from schemas.kv_events import (
    GPU,
    OFFLOAD_MEDIA,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventBatch,
    Medium,
)


@dataclass(frozen=True, slots=True)
class StoreOp:
    worker_id: str
    engine_hashes: tuple[int, ...]
    fleet_hashes: tuple[int, ...]  # the same object as engine_hashes: the engine hashes like us
    # the hashes form a chain run and this is the fleet hash of its first block's parent (None: a
    # root block); UNKNOWN: not known to be a chain (routing hints, snapshot restores)
    parent: int | None = UNKNOWN


@dataclass(frozen=True, slots=True)
class RemoveOp:
    worker_id: str
    engine_hashes: tuple[int, ...]
    fleet_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ClearOp:
    worker_id: str


@dataclass(frozen=True, slots=True)
class ShapeOp:
    """Whether the worker's held blocks are prefix-closed from now on (see ``shape``); an index
    may bisect its chains when they are, and must walk them block by block otherwise."""

    worker_id: str
    hole_free: bool


IndexOp = StoreOp | RemoveOp | ClearOp | ShapeOp


def tier_holder(worker_id: str, medium: Medium) -> str:
    """Who holds a worker's blocks of a tier in the index: the worker itself for GPU memory,
    ``"{worker} {medium}"`` for a tier below it (a space: no worker id has one, they are
    subject tokens). Each holder has its own blocks, map and shape, so a block counts as held
    while any of the worker's holders has it; the worker's event ids cover all of them."""
    return worker_id if medium == GPU else f"{worker_id} {medium}"


def holders(worker_id: str) -> tuple[str, ...]:
    """The worker and its lower tiers, as index holders."""
    return (worker_id, *(tier_holder(worker_id, m) for m in OFFLOAD_MEDIA))


def worker_of(holder: str) -> str:
    """The worker a holder belongs to."""
    return holder.split(" ", 1)[0]


class WireBlockStored(msgspec.Struct, frozen=True, tag="stored", omit_defaults=True):
    """``BlockStored`` as the indexer decodes it: ``token_ids`` still msgpack-encoded."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: msgspec.Raw
    block_size: int
    lora_name: str | None = None
    medium: Medium = GPU


class WireKvBatch(msgspec.Struct, frozen=True, omit_defaults=True):
    """``KvEventBatch`` with lazily decoded token ids (same wire layout and version)."""

    worker_id: str
    model: str
    event_id: int
    ts_s: float
    events: tuple[WireBlockStored | BlockRemoved | AllBlocksCleared, ...]
    v: int = 2


@dataclass
class Translation:
    ops: list[IndexOp] = field(default_factory=list)
    missing_parent: bool = False  # a stored run whose parent block we never saw
    unreadable_tokens: bool = False  # a stored run whose token ids are not a list of ints
    unknown_removals: int = 0  # removed blocks we never saw stored (harmless)


class EventTranslator:
    def __init__(self) -> None:
        self._maps: dict[str, dict[int, int]] = {}  # worker -> engine hash -> fleet hash
        self._shapes: dict[str, WorkerShape] = {}
        self._announced: dict[str, bool] = {}  # the hole_free last sent in a ShapeOp
        self._fleet_hashing: set[str] = set()  # workers whose engine hashes proved to be ours

    def knows(self, worker_id: str) -> bool:
        return worker_id in self._maps

    def mapping(self, worker_id: str) -> dict[int, int]:
        return self._maps.setdefault(worker_id, {})

    def preload(
        self,
        worker_id: str,
        mapping: dict[int, int],
        parents: dict[int, int | None] | None = None,
    ) -> None:
        """Refill a worker from the index: engine -> fleet hash, and each held fleet block's
        parent (``UNKNOWN`` if the index does not have it; ``None``: not given at all, then the
        worker counts as holey unless it holds nothing)."""
        self._maps[worker_id] = dict(mapping)
        if parents is not None:
            self._shapes[worker_id] = WorkerShape.restore(parents)
        else:
            shape = self._shapes[worker_id] = WorkerShape()
            shape.known = not mapping
        self._announced.pop(worker_id, None)

    def forget(self, worker_id: str) -> None:
        """Drop a worker and its tiers."""
        for hid in holders(worker_id):
            self._maps.pop(hid, None)
            self._shapes.pop(hid, None)
            self._announced.pop(hid, None)
            self._fleet_hashing.discard(hid)

    def hashes_like_fleet(self, worker_id: str) -> bool:
        return worker_id in self._fleet_hashing

    def translate(self, batch: KvEventBatch | WireKvBatch) -> Translation:
        out = Translation()
        wid = batch.worker_id
        touched: set[str] = set()
        for ev in batch.events:
            if isinstance(ev, AllBlocksCleared):
                for hid in holders(wid) if ev.medium is None else (tier_holder(wid, ev.medium),):
                    if hid != wid and not self._maps.get(hid):
                        continue  # a tier that holds nothing here
                    self.mapping(hid).clear()
                    out.ops.append(ClearOp(hid))
                    self._shapes.setdefault(hid, WorkerShape()).clear()
                    touched.add(hid)
                continue
            hid = tier_holder(wid, ev.medium)
            mp = self.mapping(hid)
            shape = self._shapes.setdefault(hid, WorkerShape())
            touched.add(hid)
            if isinstance(ev, BlockStored | WireBlockStored):
                op = self._stored(hid, mp, ev, out, wid)
                if op is not None:
                    out.ops.append(op)
                    shape.stored(op.fleet_hashes, op.parent)
            else:
                fleet = []
                engine = []
                for h in ev.block_hashes:
                    f = mp.pop(h, None)
                    if f is None:
                        out.unknown_removals += 1
                    else:
                        engine.append(h)
                        fleet.append(f)
                if fleet:
                    engine_t = tuple(engine)
                    fleet_t = engine_t if engine == fleet else tuple(fleet)
                    out.ops.append(RemoveOp(hid, engine_t, fleet_t))
                    shape.removed(fleet_t)
        for hid in sorted(touched | {wid}):
            shape = self._shapes.setdefault(hid, WorkerShape())
            if self._announced.get(hid) is not shape.hole_free:
                self._announced[hid] = shape.hole_free
                out.ops.append(ShapeOp(hid, shape.hole_free))
        return out

    def _parent(self, wid: str, mp: dict[int, int], engine_hash: int) -> int | None:
        """The fleet hash of a parent block held in any of the worker's tiers."""
        found = mp.get(engine_hash)
        if found is not None:
            return found
        for hid in holders(wid):
            other = self._maps.get(hid)
            if other is not None and other is not mp:
                found = other.get(engine_hash)
                if found is not None:
                    return found
        return None

    def _stored(
        self,
        wid: str,
        mp: dict[int, int],
        ev: BlockStored | WireBlockStored,
        out: Translation,
        worker_id: str,
    ) -> StoreOp | None:
        """``wid``: the holder (the worker or one of its tiers), ``mp`` its map."""
        parent: int | None = None
        if ev.parent_block_hash is not None:
            parent = self._parent(worker_id, mp, ev.parent_block_hash)
            if parent is None:
                out.missing_parent = True
                return None
        seed = hash_seed(ev.lora_name)
        bs = ev.block_size
        if wid in self._fleet_hashing and ev.block_hashes:
            try:
                n_tokens, head = _token_head(ev.token_ids, bs)
            except WireDecodeError:
                out.unreadable_tokens = True
                return None
            n = min(n_tokens // bs, len(ev.block_hashes))
            if n and _first_hash(head, bs, seed, parent) == ev.block_hashes[0]:
                engine = tuple(ev.block_hashes[:n])  # no copy when n covers the tuple
                mp.update(zip(engine, engine, strict=True))
                return StoreOp(wid, engine, engine, parent)
            self._fleet_hashing.discard(wid)
        try:
            fleet = block_hashes(_tokens(ev.token_ids), bs, seed, parent)
        except (WireDecodeError, OverflowError):  # not u32 token ids
            out.unreadable_tokens = True
            return None
        n = min(len(fleet), len(ev.block_hashes))
        if not n:
            return None
        engine = tuple(ev.block_hashes[:n])
        fleet_t = tuple(fleet[:n])
        if fleet_t == engine:
            self._fleet_hashing.add(wid)
            fleet_t = engine
        mp.update(zip(engine, fleet_t, strict=True))
        return StoreOp(wid, engine, fleet_t, parent)


def _first_hash(head: Sequence[int], bs: int, seed: int, parent: int | None) -> int | None:
    local = local_block_hashes(head, bs, seed)
    return chain_hash(parent, local[0], seed) if local else None


_token_list = msgspec.msgpack.Decoder(tuple[int, ...])


def _tokens(token_ids: Sequence[int] | msgspec.Raw) -> Sequence[int]:
    if not isinstance(token_ids, msgspec.Raw):
        return token_ids
    try:
        return _token_list.decode(token_ids)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise WireDecodeError(f"BlockStored.token_ids: {exc}") from exc


def _token_head(token_ids: Sequence[int] | msgspec.Raw, count: int) -> tuple[int, Sequence[int]]:
    """(number of token ids, the first ``count`` of them), reading only those from a Raw."""
    if not isinstance(token_ids, msgspec.Raw):
        return len(token_ids), token_ids[:count]
    head = _msgpack_uint_head(memoryview(token_ids), count)
    if head is None:  # not the compact form this reader knows: decode the whole list
        tokens = _tokens(token_ids)
        return len(tokens), tokens[:count]
    return head


def _msgpack_uint_head(b: memoryview, count: int) -> tuple[int, list[int]] | None:
    """Length and first ``count`` items of a msgpack array of unsigned ints below 2**32; None for
    anything else (the caller falls back to the full decoder, which also validates)."""
    if not b:
        return None
    t = b[0]
    if 0x90 <= t <= 0x9F:
        n, i = t & 0x0F, 1
    elif t == 0xDC and len(b) >= 3:
        n, i = (b[1] << 8) | b[2], 3
    elif t == 0xDD and len(b) >= 5:
        n, i = int.from_bytes(b[1:5], "big"), 5
    else:
        return None
    out: list[int] = []
    try:
        for _ in range(min(count, n)):
            t = b[i]
            if t < 0x80:
                out.append(t)
                i += 1
            elif t == 0xCC:
                out.append(b[i + 1])
                i += 2
            elif t == 0xCD:
                out.append((b[i + 1] << 8) | b[i + 2])
                i += 3
            elif t == 0xCE:
                out.append(int.from_bytes(b[i + 1 : i + 5], "big"))
                i += 5
            else:
                return None
    except IndexError:
        return None
    return n, out


def fleet_hashes_for_prompt(
    token_ids: Sequence[int], block_size: int, lora_name: str | None = None
) -> list[int]:
    """What the router looks up for a request (the same function the mocker hashes with)."""
    return block_hashes(token_ids, block_size, hash_seed(lora_name))
