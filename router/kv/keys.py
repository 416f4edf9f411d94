"""Redis key layout of the prefix index and the routing reservations (one place, one namespace).

The index is cut into **shards** (``shards.py``): a block lives on the shard its branch tag names
(``schemas.hashing``), and a request's route reads one shard. Every key of shard ``i`` carries the
shard's hash tag (``{ns}:v3:{<tag>}:...``), so on a Redis Cluster each shard is one slot on one
node and every script touches one slot; on a single Redis (or Sentinel) the shards share the
server. ``{ns}`` defaults to ``jf:{subject prefix}``, so several fleets share a Redis; a layout
change bumps ``LAYOUT`` (an indexer of the new layout finds no position and rebuilds).

Per shard (``{b}`` = ``{ns}:v3:{<tag>}``):

| key | type | holds |
|---|---|---|
| ``{b}:blk:{model}`` | hash | block hash (8 raw bytes) -> holder bitmap (bit per slot, below) |
| ``{b}:nohole:{model}`` | string | bit per slot: the holder's blocks are prefix-closed |
| ``{b}:slot:{model}`` | hash | holder -> slot (a copy of shard 0's table, for routes) |
| ``{b}:slotw:{model}`` | hash | slot -> holder (the same copy, the other way) |
| ``{b}:slotver:{model}`` | string | version of that copy (bumped on every change of the table) |
| ``{b}:pos`` | hash | indexer group -> highest FLEET_KV sequence applied to this shard |
| ``{b}:evid:{model}`` | hash | worker -> its last event id applied to this shard |
| ``{b}:loadp:{model}`` | hash | worker -> reserved prefill blocks (routes of this shard) |
| ``{b}:loadd:{model}`` | hash | worker -> reserved decode blocks |
| ``{b}:r:{request}`` | hash | one reservation (worker, model, p, d); TTL = reservation TTL |
| ``{b}:rexp`` | zset | request id -> expiry (ms); expired reservations are released lazily |
| ``{b}:epoch`` | string | id and token, new where missing at a lead; FLUSHALL: gone |

Shard 0 also holds the slot table's source and its free lists:

| key | type | holds |
|---|---|---|
| ``{b0}:slotnext:{model}`` | string | next new slot |
| ``{b0}:slotfree:{model}`` | list | slots swept clean, to reuse |
| ``{b0}:slotdead:{model}`` | zset | retired slots -> when (ms): bits still to sweep |
| ``{b0}:leader:{group}`` | string | indexer leadership lock of a group of workers (owner id, TTL) |

Holder bitmap: bit ``s`` (most significant bit first, as ``SETBIT`` numbers them) is set when the
holder in slot ``s`` holds the block; trailing zero bytes are trimmed and a block nobody holds has
no field. A holder is a worker or a lower tier of its cache (``translate.tier_holder``).

**Slots and generations.** A holder gets a slot when it joins. A departure, an
``AllBlocksCleared`` or a heal does not touch the blocks: the holder's slot is *retired* (it
leaves the table, so no route reads its bits) and, for a holder that stays, a fresh slot is
given. A sweeper clears retired slots' bits later in bounded steps (``HSCAN`` of a few hundred
fields a call) and only then frees the slots for reuse. So no call is proportional to a worker's
cache, and there is no per-worker block list to keep: the index holds one field per distinct
block, whoever holds it.

Prefix-closed holders (``nohole``, from the workers' ``ShapeChanged``): every block such a holder
holds has its parent held too, so holding block i of a request's chain means holding blocks
0..i-1 and a match bisects the chain (about log2(n) reads) instead of walking it.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

RESERVATION_TTL_MS = 120_000  # a reservation not released within this expires on its own
LEADER_TTL_MS = 5_000  # an indexer leader that stops renewing loses the lock after this
LAYOUT = "v3"  # version of the layout above


def pack_hashes(hashes: Sequence[int]) -> bytes:
    """Block hashes as one argument: 8 raw big-endian bytes each (one arg, not one per hash:
    redis-py spends microseconds per argument, Lua slices the blob for free)."""
    return struct.pack(f">{len(hashes)}Q", *hashes)


def unpack_hash(raw: bytes) -> int:
    return int.from_bytes(raw, "big")


def unpack_blob(blob: bytes) -> tuple[int, ...]:
    return struct.unpack(f">{len(blob) // 8}Q", blob)


@dataclass(frozen=True)
class ShardKeys:
    """The keys of one shard: every one carries the shard's hash tag."""

    ns: str
    tag: str

    @property
    def base(self) -> str:
        """Prefix of every key of the shard (what the Lua scripts get as ``ns``)."""
        return f"{self.ns}:{LAYOUT}:{{{self.tag}}}"

    def blocks(self, model: str) -> str:
        return f"{self.base}:blk:{model}"

    def nohole(self, model: str) -> str:
        return f"{self.base}:nohole:{model}"

    def slot(self, model: str) -> str:
        return f"{self.base}:slot:{model}"

    def slotw(self, model: str) -> str:
        return f"{self.base}:slotw:{model}"

    def slotver(self, model: str) -> str:
        return f"{self.base}:slotver:{model}"

    def slotnext(self, model: str) -> str:
        return f"{self.base}:slotnext:{model}"

    def slotfree(self, model: str) -> str:
        return f"{self.base}:slotfree:{model}"

    def slotdead(self, model: str) -> str:
        return f"{self.base}:slotdead:{model}"

    def evid(self, model: str) -> str:
        return f"{self.base}:evid:{model}"

    def load_prefill(self, model: str) -> str:
        return f"{self.base}:loadp:{model}"

    def load_decode(self, model: str) -> str:
        return f"{self.base}:loadd:{model}"

    @property
    def pos(self) -> str:
        return f"{self.base}:pos"

    @property
    def rexp(self) -> str:
        return f"{self.base}:rexp"

    def reservation(self, request_id: str) -> str:
        return f"{self.base}:r:{request_id}"

    @property
    def epoch(self) -> str:
        """Written by the indexer with the shard's first position; gone after a FLUSHALL (see
        ``router.indexer.Indexer.check_epoch``)."""
        return f"{self.base}:epoch"

    def leader(self, group: int) -> str:
        return f"{self.base}:leader:{group}"

    def models(self) -> str:
        """Pattern of this shard's block hashes (one per model), for a scan."""
        return f"{self.base}:blk:*"

    def is_reservation(self, key: str) -> bool:
        """Routing state (reservations and the loads they add up to), not the index."""
        rest = key[len(self.base) + 1 :]
        return rest.startswith(("r:", "rexp", "loadp:", "loadd:"))


def namespace(subject_prefix: str) -> str:
    return f"jf:{subject_prefix}"
