"""Whether a worker's cached blocks are prefix-closed: every block it holds has its parent held.

A match asks, per worker, how many leading blocks of a request's chain it holds. If every block a
worker holds has its parent held too (no "holes"), holding block i of a chain implies holding
blocks 0..i-1, so the answer is found by bisection: about log2(n) block reads per distinct answer
instead of n (``walk`` / ``bisect`` in ``lua``). Engines that evict leaves first stay hole-free:
vLLM frees a finished request's blocks tail first and a block in use keeps its parents in use, so
a parent never leaves the cache before its children. A hole appears when a block whose child is
still held is removed, and goes away when the block is stored again or the orphaned children go.

``WorkerShape`` mirrors the blocks one tier of a worker's cache holds (a store adds them, any
removal takes them away) with each held block's parent and each block's number of held children,
and counts orphans: held blocks whose parent is not held. ``hole_free`` = no orphans. The worker
keeps one per tier (``kv_relay``) and tells the index when it flips (``ShapeChanged``): the state
lives beside the cache it describes, bounded by that cache, not in the indexer.

Pure, and cheap on the common path: a stored run of new blocks is two ``dict.update`` calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, repeat


class WorkerShape:
    __slots__ = ("kids", "orphans", "parent")

    def __init__(self) -> None:
        self.parent: dict[int, int | None] = {}  # held block -> its parent (None: a root block)
        self.kids: dict[int, int] = {}  # block -> number of held blocks whose parent it is
        self.orphans = 0  # held blocks whose parent is not held

    @property
    def hole_free(self) -> bool:
        return self.orphans == 0

    def __len__(self) -> int:
        return len(self.parent)

    def stored(self, fleet: Sequence[int], parent: int | None) -> None:
        """A run of blocks, each the parent of the next; ``parent`` is the first one's."""
        if not fleet:
            return
        held, kids = self.parent, self.kids
        if not self.orphans and held.keys().isdisjoint(fleet):
            # The common case: new blocks. Without orphans, a block that is not held has no held
            # children (they would be orphans), so none of these has kids yet.
            held.update(zip(fleet, chain((parent,), fleet), strict=False))  # one parent each
            kids.update(zip(fleet[:-1], repeat(1)))
            if parent is not None:
                kids[parent] = kids.get(parent, 0) + 1
                if parent not in held:
                    self.orphans += 1
            return
        prev = parent
        for f in fleet:
            if f not in held:
                held[f] = prev
                if prev is not None:
                    kids[prev] = kids.get(prev, 0) + 1
                    if prev not in held:
                        self.orphans += 1
                self.orphans -= kids.get(f, 0)  # its held children have their parent back
            prev = f

    def removed(self, fleet: Sequence[int]) -> None:
        held, kids = self.parent, self.kids
        for f in fleet:
            if f not in held:
                continue
            p = held.pop(f)
            if p is not None:
                n = kids[p] - 1
                if n:
                    kids[p] = n
                else:
                    del kids[p]
                if p not in held:
                    self.orphans -= 1  # f was an orphan itself
            self.orphans += kids.get(f, 0)  # its held children lost their parent

    def clear(self) -> None:
        self.parent.clear()
        self.kids.clear()
        self.orphans = 0
