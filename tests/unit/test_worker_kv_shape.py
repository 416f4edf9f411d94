"""WorkerShape: which workers' cached blocks are prefix-closed (a match may bisect their chains)."""

from __future__ import annotations

import random

import pytest

from workers.kv_shape import WorkerShape

# ops: ("S", blocks, parent) stores a run (each block the parent of the next), ("R", blocks)
# removes, ("C",) clears. Blocks are small ints standing for fleet hashes.
CASES = [
    ("nothing", [], True),
    ("one chain", [("S", (1, 2, 3), None)], True),
    ("a leaf goes", [("S", (1, 2, 3), None), ("R", (3,))], True),
    ("a middle block goes", [("S", (1, 2, 3), None), ("R", (2,))], False),
    ("the root goes", [("S", (1, 2, 3), None), ("R", (1,))], False),
    ("the hole is stored again", [("S", (1, 2, 3), None), ("R", (2,)), ("S", (2,), 1)], True),
    ("the orphan goes too", [("S", (1, 2, 3), None), ("R", (2,)), ("R", (3,))], True),
    ("tail first eviction", [("S", (1, 2, 3), None), ("R", (3,)), ("R", (2,)), ("R", (1,))], True),
    ("a run continues a chain", [("S", (1, 2), None), ("S", (3, 4), 2)], True),
    (
        "a branch point goes",
        [("S", (1, 2, 3), None), ("S", (4,), 2), ("R", (2,)), ("R", (3,))],
        False,  # 4 still has no parent
    ),
    (
        "both branches go, then the branch point",
        [("S", (1, 2, 3), None), ("S", (4,), 2), ("R", (3, 4)), ("R", (2,))],
        True,
    ),
    ("a run whose parent is not held", [("S", (5, 6), 9)], False),
    ("stored twice", [("S", (1, 2), None), ("S", (1, 2), None), ("R", (2,))], True),
    ("removed twice", [("S", (1, 2, 3), None), ("R", (2,)), ("R", (2,)), ("S", (2,), 1)], True),
    ("cleared", [("S", (1, 2, 3), None), ("R", (2,)), ("C",)], True),
    ("a block never stored goes", [("S", (1,), None), ("R", (7,))], True),
]


def apply(shape: WorkerShape, ops: list[tuple]) -> None:
    for op in ops:
        if op[0] == "S":
            shape.stored(op[1], op[2])
        elif op[0] == "R":
            shape.removed(op[1])
        else:
            shape.clear()


def brute_orphans(shape: WorkerShape) -> int:
    held = shape.parent
    return sum(1 for p in held.values() if p is not None and p not in held)


@pytest.mark.parametrize(("name", "ops", "hole_free"), CASES, ids=[c[0] for c in CASES])
def test_hole_free(name, ops, hole_free):
    shape = WorkerShape()
    apply(shape, ops)
    assert shape.hole_free is hole_free
    assert shape.orphans == brute_orphans(shape)


@pytest.mark.parametrize("seed", range(20))
def test_random_ops_match_a_recount(seed):
    """Random stores (from a held parent, a root, or an unheld parent), removals and clears over
    a small tree: the running count always equals a recount."""
    rng = random.Random(seed)
    parent_of = {b: (None if b < 4 else rng.randrange(b)) for b in range(40)}
    shape = WorkerShape()
    for _ in range(300):
        r = rng.random()
        if r < 0.5:
            b = rng.randrange(40)
            run = [b]
            while len(run) < 4 and (kids := [k for k, p in parent_of.items() if p == run[-1]]):
                run.append(rng.choice(kids))
            shape.stored(tuple(run), parent_of[b])
        elif r < 0.97:
            shape.removed(tuple(rng.sample(range(40), rng.randint(1, 3))))
        else:
            shape.clear()
        assert shape.orphans == brute_orphans(shape)
        assert all(v > 0 for v in shape.kids.values())
        counted = {}
        for p in shape.parent.values():
            if p is not None:
                counted[p] = counted.get(p, 0) + 1
        assert counted == shape.kids
