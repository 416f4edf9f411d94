"""Whether a worker's cached blocks are prefix-closed: every block it holds has its parent held.

A match asks, per worker, how many leading blocks of a request's chain it holds. If every block a
worker holds has its parent held too (no "holes"), holding block i of a chain implies holding
blocks 0..i-1, so the answer is found by bisection: about log2(n) block reads per distinct answer
instead of n (``walk`` / ``bisect`` in ``lua``). Engines that evict leaves first stay hole-free:
vLLM frees a finished request's blocks tail first and a block in use keeps its parents in use, so
a parent never leaves the cache before its children. A hole appears when a block whose child is
still held is removed, and goes away when the block is stored again or the orphaned children go.

``WorkerShape`` mirrors one worker's holder bits in the index (a store sets them, any removal
clears them) with each held block's parent and each block's number of held children, and counts
orphans: held blocks whose parent is not held. ``hole_free`` = no orphans and the structure known
(a worker restored without its parents, e.g. from a snapshot, is not known until it clears).

Pure, and cheap on the common path: a stored run of new blocks is two ``dict.update`` calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import chain, repeat

UNKNOWN = -1  # the parent of a block restored without it (hashes are unsigned, never -1)


class WorkerShape:
    __slots__ = ("kids", "known", "orphans", "parent")

    def __init__(self) -> None:
        self.parent: dict[int, int | None] = {}  # held block -> its parent (None: a root block)
        self.kids: dict[int, int] = {}  # block -> number of held blocks whose parent it is
        self.orphans = 0  # held blocks whose parent is not held
        self.known = True

    @property
    def hole_free(self) -> bool:
        return self.known and self.orphans == 0

    @classmethod
    def restore(cls, parents: Mapping[int, int | None]) -> WorkerShape:
        """The shape of held blocks -> parent (``UNKNOWN`` allowed: then not known)."""
        shape = cls()
        shape.parent = dict(parents)
        for p in shape.parent.values():
            if p == UNKNOWN:
                shape.known = False
            elif p is not None:
                shape.kids[p] = shape.kids.get(p, 0) + 1
                if p not in shape.parent:
                    shape.orphans += 1
        return shape

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
            if p is not None and p != UNKNOWN:
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
        self.known = True
