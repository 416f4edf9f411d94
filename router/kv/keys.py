"""Redis key layout of the prefix index and the routing reservations (one place, one namespace).

All keys start with ``{ns}`` (default ``jf:{subject prefix}``), so several fleets share a Redis.
The index and reservation keys sit under ``{ns}:{LAYOUT}`` (``base`` below): a layout change
bumps ``LAYOUT``, so an indexer of the new layout finds no position, restores the latest snapshot
(whose format does not depend on the layout) and replays the rest of FLEET_KV, instead of
misreading keys of the old one. The leader lock stays outside, so old and new indexers still
exclude each other.

| key (``{b}`` = ``{ns}:{LAYOUT}``) | type | holds |
|---|---|---|
| ``{b}:slot:{model}`` | hash | worker id -> bit slot (small int, reused after a worker leaves) |
| ``{b}:slotmap:{model}`` | string | the slot hash as one msgpack map (ROUTE decodes it in C) |
| ``{b}:slotfree:{model}`` | list | freed slots |
| ``{b}:slotnext:{model}`` | string | next new slot |
| ``{b}:blk:{model}`` | hash | block hash (8 raw bytes) -> holder bitmap (see below) |
| ``{b}:nohole:{model}`` | string | bit per slot: the worker's blocks are prefix-closed (below) |
| ``{b}:map:{model}:{worker}`` | hash | engine hash -> fleet hash and parent (see below) |
| ``{b}:evid:{model}`` | hash | worker id -> last applied event id |
| ``{b}:pos`` | hash | ``seq`` -> highest FLEET_KV stream sequence applied |
| ``{b}:loadp:{model}`` | hash | worker id -> reserved prefill blocks |
| ``{b}:loadd:{model}`` | hash | worker id -> reserved decode blocks |
| ``{b}:r:{request}`` | hash | one reservation (worker, model, p, d); TTL = reservation TTL |
| ``{b}:rexp`` | zset | request id -> expiry (ms); expired reservations are released lazily |
| ``{ns}:leader`` | string | indexer leadership lock (owner id, TTL) |

Holder bitmap: bit ``s`` (most significant bit first, as ``SETBIT`` numbers them) is set when the
worker in slot ``s`` holds the block; trailing zero bytes are trimmed and a block nobody holds has
no field. All blocks of a model live in one hash, not one key each: a match reads a request's
blocks with one ``HMGET`` whose fields are the raw hashes (no per-block key to build in Lua), and
the indexer updates a run of blocks with one ``HMGET`` + one ``HSET`` instead of a command per
block (about 1 µs of Redis time per block instead of 3-5; memory per block is smaller too). It
ties the index of a model to one Redis node: single-node Redis or Sentinel, not Redis Cluster.

Map value, by length (hashes 8 raw bytes; the parent is the fleet hash of the block before it in
the worker's chain, kept so a restarted indexer can rebuild which workers are prefix-closed):

| length | fleet hash | parent |
|---|---|---|
| 0 | the engine hash | none (a root block) |
| 1 (``?``) | the engine hash | unknown (restored from a snapshot) |
| 8 | the engine hash | the value |
| 9 | the first 8 bytes | none if the last byte is ``r``, unknown if ``?`` |
| 16 | the first 8 bytes | the last 8 |

Engines that hash like the fleet (e.g. the mocker) thus store no second copy of the hash, and the
parent of all but a run's first block is a string the script already holds.

Prefix-closed workers (``nohole``, set by the indexer from ``shape.WorkerShape``): every block
such a worker holds has its parent held too, so holding block i of a request's chain means holding
blocks 0..i-1 and a match bisects the chain (about log2(n) reads) instead of walking it. A worker
without the bit (a hole, or structure unknown) is walked block by block, as every worker was.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

RESERVATION_TTL_MS = 120_000  # a reservation not released within this expires on its own
LEADER_TTL_MS = 5_000  # an indexer leader that stops renewing loses the lock after this
LAYOUT = "v2"  # version of the layout above


def pack_hashes(hashes: Sequence[int]) -> bytes:
    """Block hashes as one argument: 8 raw big-endian bytes each (one arg, not one per hash:
    redis-py spends microseconds per argument, Lua slices the blob for free)."""
    return struct.pack(f">{len(hashes)}Q", *hashes)


def unpack_hash(raw: bytes) -> int:
    return int.from_bytes(raw, "big")


def unpack_blob(blob: bytes) -> tuple[int, ...]:
    return struct.unpack(f">{len(blob) // 8}Q", blob)


@dataclass(frozen=True)
class KvKeys:
    ns: str

    @classmethod
    def for_prefix(cls, subject_prefix: str) -> KvKeys:
        return cls(f"jf:{subject_prefix}")

    @property
    def base(self) -> str:
        """Prefix of every index and reservation key (what the Lua scripts get as ``ns``)."""
        return f"{self.ns}:{LAYOUT}"

    def slot(self, model: str) -> str:
        return f"{self.base}:slot:{model}"

    def blocks(self, model: str) -> str:
        return f"{self.base}:blk:{model}"

    def map(self, model: str, worker_id: str) -> str:
        return f"{self.base}:map:{model}:{worker_id}"

    def map_prefix(self) -> str:
        return f"{self.base}:map:"

    def evid(self, model: str) -> str:
        return f"{self.base}:evid:{model}"

    @property
    def pos(self) -> str:
        return f"{self.base}:pos"

    def load_prefill(self, model: str) -> str:
        return f"{self.base}:loadp:{model}"

    def load_decode(self, model: str) -> str:
        return f"{self.base}:loadd:{model}"

    @property
    def leader(self) -> str:
        return f"{self.ns}:leader"

    @property
    def epoch(self) -> str:
        """Written by the indexer with its first position; gone after a FLUSHALL (see
        ``router.indexer.Indexer.check_epoch``)."""
        return f"{self.ns}:epoch"

    def is_reservation(self, key: str) -> bool:
        """Routing state (reservations and the loads they add up to), not the index."""
        rest = key[len(self.base) + 1 :]
        return rest.startswith(("r:", "rexp", "loadp:", "loadd:"))
