"""Redis key layout of the prefix index and the routing reservations (one place, one namespace).

All keys start with ``{ns}`` (default ``jf:{subject prefix}``), so several fleets share a Redis.

| key | type | holds |
|---|---|---|
| ``{ns}:slot:{model}`` | hash | worker id -> bit slot (small int, reused after a worker leaves) |
| ``{ns}:slotfree:{model}`` | list | freed slots |
| ``{ns}:slotnext:{model}`` | string | next new slot |
| ``{ns}:b:{model}:{hash}`` | string | bitmap of the slots holding block ``hash`` (8 raw bytes) |
| ``{ns}:map:{model}:{worker}`` | hash | engine hash -> fleet hash (8 raw bytes each) |
| ``{ns}:evid:{model}`` | hash | worker id -> last applied event id |
| ``{ns}:pos`` | hash | ``seq`` -> highest FLEET_KV stream sequence applied |
| ``{ns}:load:{model}`` | hash | ``{worker}:p`` / ``:d`` -> reserved prefill / decode blocks |
| ``{ns}:r:{request}`` | hash | one reservation (worker, model, p, d); TTL = reservation TTL |
| ``{ns}:rexp`` | zset | request id -> expiry (ms); expired reservations are released lazily |
| ``{ns}:leader`` | string | indexer leadership lock (owner id, TTL) |

A block key is a bitmap, not a set: a match reads one compact value per block and tests only the
slots still matching (Lua's ``bit`` library on single bytes), which keeps the script short.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

RESERVATION_TTL_MS = 120_000  # a reservation not released within this expires on its own
LEADER_TTL_MS = 5_000  # an indexer leader that stops renewing loses the lock after this


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

    def slot(self, model: str) -> str:
        return f"{self.ns}:slot:{model}"

    def slotfree(self, model: str) -> str:
        return f"{self.ns}:slotfree:{model}"

    def slotnext(self, model: str) -> str:
        return f"{self.ns}:slotnext:{model}"

    def block_prefix(self, model: str) -> str:
        return f"{self.ns}:b:{model}:"

    def map(self, model: str, worker_id: str) -> str:
        return f"{self.ns}:map:{model}:{worker_id}"

    def evid(self, model: str) -> str:
        return f"{self.ns}:evid:{model}"

    @property
    def pos(self) -> str:
        return f"{self.ns}:pos"

    def load(self, model: str) -> str:
        return f"{self.ns}:load:{model}"

    def reservation_prefix(self) -> str:
        return f"{self.ns}:r:"

    @property
    def rexp(self) -> str:
        return f"{self.ns}:rexp"

    @property
    def leader(self) -> str:
        return f"{self.ns}:leader"
