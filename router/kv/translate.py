"""Turn a worker's ``KvEventBatch`` into index operations on the fleet's own block hashes.

Engines report their own block hashes (vLLM's are opaque to us). For every stored run of blocks the
translator recomputes the fleet's chained hashes from the token ids, continuing from the fleet
hash of the engine's parent block, and remembers engine hash -> fleet hash per worker so later
removals can be applied. The mapping is a cache of what the index itself stores: after a restart
the shell refills it from the index (``preload``).

Pure: no I/O. ``translate`` returns the ops and the mapping changes; a missing parent (an event
lost before this one) is reported as a gap so the caller can heal the worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from schemas.hashing import block_hashes, hash_seed
from schemas.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEventBatch


@dataclass(frozen=True, slots=True)
class StoreOp:
    worker_id: str
    engine_hashes: tuple[int, ...]
    fleet_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RemoveOp:
    worker_id: str
    engine_hashes: tuple[int, ...]
    fleet_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ClearOp:
    worker_id: str


IndexOp = StoreOp | RemoveOp | ClearOp


@dataclass
class Translation:
    ops: list[IndexOp] = field(default_factory=list)
    missing_parent: bool = False  # a stored run whose parent block we never saw
    unknown_removals: int = 0  # removed blocks we never saw stored (harmless)


class EventTranslator:
    def __init__(self) -> None:
        self._maps: dict[str, dict[int, int]] = {}  # worker -> engine hash -> fleet hash

    def knows(self, worker_id: str) -> bool:
        return worker_id in self._maps

    def mapping(self, worker_id: str) -> dict[int, int]:
        return self._maps.setdefault(worker_id, {})

    def preload(self, worker_id: str, mapping: dict[int, int]) -> None:
        self._maps[worker_id] = dict(mapping)

    def forget(self, worker_id: str) -> None:
        self._maps.pop(worker_id, None)

    def translate(self, batch: KvEventBatch) -> Translation:
        out = Translation()
        wid = batch.worker_id
        mp = self.mapping(wid)
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                self._stored(wid, mp, ev, out)
            elif isinstance(ev, BlockRemoved):
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
                    out.ops.append(RemoveOp(wid, tuple(engine), tuple(fleet)))
            elif isinstance(ev, AllBlocksCleared):
                mp.clear()
                out.ops.append(ClearOp(wid))
        return out

    @staticmethod
    def _stored(wid: str, mp: dict[int, int], ev: BlockStored, out: Translation) -> None:
        parent: int | None = None
        if ev.parent_block_hash is not None:
            parent = mp.get(ev.parent_block_hash)
            if parent is None:
                out.missing_parent = True
                return
        seed = hash_seed(ev.lora_name)
        fleet = block_hashes(ev.token_ids, ev.block_size, seed, parent)
        n = min(len(fleet), len(ev.block_hashes))
        engine = tuple(ev.block_hashes[:n])
        for e, f in zip(engine, fleet[:n], strict=True):
            mp[e] = f
        if n:
            out.ops.append(StoreOp(wid, engine, tuple(fleet[:n])))


def fleet_hashes_for_prompt(
    token_ids: Sequence[int], block_size: int, lora_name: str | None = None
) -> list[int]:
    """What the router looks up for a request (the same function the mocker hashes with)."""
    return block_hashes(token_ids, block_size, hash_seed(lora_name))
