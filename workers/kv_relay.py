"""A worker's KV events as the fleet indexes them (``KvEventBatch`` version 3). Pure.

Engines report their own block hashes. The mocker hashes like the fleet (``schemas.hashing``);
vLLM's hashes are opaque. The relay turns either into the fleet's chained hashes before they leave
the worker, so the indexer applies events as they come and keeps nothing per block (NVIDIA
Dynamo's publishers hash in the worker too). Per tier of the cache (``medium``) it keeps:

- for an engine with opaque hashes, engine hash -> fleet hash: a stored run's fleet hashes are
  computed from its token ids, continuing from the fleet hash of the engine's parent block (held
  in any tier); a run whose parent it never saw is dropped (``dropped_runs``: the engine lost
  events; the cache shadow of ``engines/vllm`` keeps such runs from coming at all); removals are
  translated through the map, and blocks it never saw stored are left out;
- a ``WorkerShape``: whether the tier's blocks are prefix-closed. When that flips, the relay adds
  a ``ShapeChanged`` after the batch's events, so the index knows when it may bisect the tier's
  chains instead of walking them.

What goes out carries no token ids (the index needs none, and they were four fifths of a stored
event's bytes). Memory: for an opaque engine, about 100 B per cached block for the map, plus the
shape's ~150 B, bounded by the worker's own cache, in the worker's process.
"""

from __future__ import annotations

from collections.abc import Iterable

from schemas.hashing import block_hashes, hash_seed
from schemas.kv_events import (
    GPU,
    OFFLOAD_MEDIA,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvCacheEvent,
    Medium,
    ShapeChanged,
)
from workers.kv_shape import WorkerShape

MEDIA: tuple[Medium, ...] = (GPU, *OFFLOAD_MEDIA)


class KvRelay:
    def __init__(self, fleet_hashing: bool, branch_blocks: int) -> None:
        """``fleet_hashing``: the engine's block hashes are the fleet's already (the mocker)."""
        self.fleet_hashing = fleet_hashing
        self.branch_blocks = branch_blocks
        self._maps: dict[Medium, dict[int, int]] = {m: {} for m in MEDIA}
        self._shapes: dict[Medium, WorkerShape] = {m: WorkerShape() for m in MEDIA}
        self._announced: dict[Medium, bool] = {}
        self.dropped_runs = 0

    def blocks(self, medium: Medium = GPU) -> int:
        """Blocks of a tier as the fleet was told."""
        return len(self._shapes[medium])

    def relay(self, events: Iterable[KvCacheEvent]) -> list[KvCacheEvent]:
        out: list[KvCacheEvent] = []
        touched: set[Medium] = set()
        for ev in events:
            if isinstance(ev, BlockStored):
                stored = self._stored(ev)
                if stored is not None:
                    out.append(stored)
                    touched.add(ev.medium)
            elif isinstance(ev, BlockRemoved):
                removed = self._removed(ev)
                if removed is not None:
                    out.append(removed)
                    touched.add(ev.medium)
            elif isinstance(ev, AllBlocksCleared):
                for medium in MEDIA if ev.medium is None else (ev.medium,):
                    self._maps[medium].clear()
                    self._shapes[medium].clear()
                    # the index gives a cleared holder a new slot: tell its shape again
                    self._announced.pop(medium, None)
                    touched.add(medium)
                out.append(ev)
            # ShapeChanged: the relay's own event; an engine has none to send
        for medium in MEDIA:
            if medium in touched:
                closed = self._shapes[medium].hole_free
                if self._announced.get(medium) is not closed:
                    self._announced[medium] = closed
                    out.append(ShapeChanged(closed, medium))
        return out

    def _parent(self, engine_hash: int | None) -> tuple[bool, int | None]:
        """(known, the fleet hash of an engine parent held in any tier; None for the root)."""
        if engine_hash is None or self.fleet_hashing:
            return True, engine_hash
        for mp in self._maps.values():
            found = mp.get(engine_hash)
            if found is not None:
                return True, found
        return False, None

    def _stored(self, ev: BlockStored) -> BlockStored | None:
        known, parent = self._parent(ev.parent_block_hash)
        if not known:
            self.dropped_runs += 1
            return None
        if self.fleet_hashing:
            fleet = ev.block_hashes
        else:
            computed = block_hashes(
                ev.token_ids, ev.block_size, hash_seed(ev.lora_name), parent, self.branch_blocks
            )
            n = min(len(computed), len(ev.block_hashes))
            if n == 0:
                return None
            fleet = tuple(computed[:n])
            self._maps[ev.medium].update(zip(ev.block_hashes[:n], fleet, strict=True))
        if not fleet:
            return None
        self._shapes[ev.medium].stored(fleet, parent)
        return BlockStored(fleet, parent, medium=ev.medium)

    def _removed(self, ev: BlockRemoved) -> BlockRemoved | None:
        if self.fleet_hashing:
            fleet = ev.block_hashes
        else:
            mp = self._maps[ev.medium]
            fleet = tuple(f for h in ev.block_hashes if (f := mp.pop(h, None)) is not None)
        if not fleet:
            return None
        self._shapes[ev.medium].removed(fleet)
        return BlockRemoved(fleet, ev.medium)
