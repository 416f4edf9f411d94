"""The fleet an index-scale run describes: its chains, who holds them, and the KV batches that
fill and churn it. Pure (no I/O): every process of a run derives the same fleet from one
``FleetSpec`` and one position (``next_chain``), so nothing but those crosses between them.

Shape (``schemas.hashing``, branch point ``branch_blocks``):

- ``roots`` first blocks (system prompts); under them ``branches`` distinct first-
  ``branch_blocks``-block prefixes (branch ``b`` under root ``b % roots``): every branch carries
  its own branch tag, so routes spread over the index's shards;
- chain ``c`` (0, 1, 2, ...) = the prefix of a random branch + ``chain_blocks - branch_blocks``
  blocks of its own, held by ``holders`` random workers.

Chains ``0 .. chains-1`` are the fill: each holder stores the chain (and the part of its branch
prefix it does not hold yet). Every later chain is churn: each holder stores it and evicts its
oldest chain (the chain's own blocks, leaf first; prefix blocks stay), so the index keeps its size
and every worker stays prefix-closed. A worker's step (one chain) is cut into batches of
``min_batch_blocks .. max_batch_blocks`` block events, as engines coalesce, and relayed through
the worker's ``KvRelay`` (fleet hashes; its ``ShapeChanged`` once, in the worker's first batch).
How many batches a step makes depends only on the fleet, so event ids are derived, not carried.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from schemas import encode
from schemas.hashing import chain_hash
from schemas.kv_events import BlockRemoved, BlockStored, KvEventBatch
from workers.kv_relay import KvRelay


@dataclass(frozen=True)
class FleetSpec:
    workers: int
    chains: int  # the fill: chains 0 .. chains-1
    chain_blocks: int = 64
    branch_blocks: int = 4
    roots: int = 16
    branches: int = 512
    holders: int = 3  # workers per chain
    seed: int = 0
    model: str = "m"
    min_batch_blocks: int = 16
    max_batch_blocks: int = 64

    @classmethod
    def sized(cls, workers: int, holder_blocks: int, seed: int = 0) -> FleetSpec:
        """The default shape, with as many chains as fill about ``holder_blocks``."""
        d = cls(workers, chains=0, seed=seed)
        chains = chains_for(holder_blocks, d.chain_blocks, d.branch_blocks, d.holders)
        return dataclasses.replace(d, chains=chains)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> FleetSpec:
        return cls(**json.loads(text))

    @property
    def tail_blocks(self) -> int:
        """Blocks a chain has of its own (below its branch prefix)."""
        return self.chain_blocks - self.branch_blocks


def worker_id(i: int) -> str:
    return f"w{i:04d}"


def chains_for(holder_blocks: int, chain_blocks: int, branch_blocks: int, holders: int) -> int:
    """Chains whose fill stores about ``holder_blocks`` block events (a holder stores a chain's
    own blocks and, about half the time, some of its branch prefix)."""
    per_chain = holders * (chain_blocks - branch_blocks + branch_blocks // 2)
    return max(1, round(holder_blocks / per_chain))


class Chains:
    """Block hashes of the branches and chains (computed on first use, then kept)."""

    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self._meta: list[tuple[int, tuple[int, ...]]] = []
        self._prefix: dict[int, tuple[int, ...]] = {}
        self._tail: dict[int, tuple[int, ...]] = {}

    def meta(self, c: int) -> tuple[int, tuple[int, ...]]:
        """(branch, holders) of chain ``c``."""
        s = self.spec
        while len(self._meta) <= c:
            rng = random.Random(f"{s.seed}:c:{len(self._meta)}")
            branch = rng.randrange(s.branches)
            self._meta.append((branch, tuple(rng.sample(range(s.workers), s.holders))))
        return self._meta[c]

    def prefix(self, branch: int) -> tuple[int, ...]:
        found = self._prefix.get(branch)
        if found is None:
            s = self.spec
            root_local = random.Random(f"{s.seed}:r:{branch % s.roots}").getrandbits(64)
            rng = random.Random(f"{s.seed}:b:{branch}")
            out = [chain_hash(None, root_local, 0, s.branch_blocks)]
            for _ in range(s.branch_blocks - 1):
                out.append(chain_hash(out[-1], rng.getrandbits(64), 0, s.branch_blocks))
            found = self._prefix[branch] = tuple(out)
        return found

    def tail(self, c: int) -> tuple[int, ...]:
        found = self._tail.get(c)
        if found is None:
            s = self.spec
            parent = self.prefix(self.meta(c)[0])[-1]
            rng = random.Random(f"{s.seed}:t:{c}")
            out: list[int] = []
            for _ in range(s.tail_blocks):
                parent = chain_hash(parent, rng.getrandbits(64), 0, s.branch_blocks)
                out.append(parent)
            found = self._tail[c] = tuple(out)
        return found

    def blocks(self, c: int) -> tuple[int, ...]:
        return self.prefix(self.meta(c)[0]) + self.tail(c)

    def forget_tails(self) -> None:
        self._tail.clear()


@dataclass
class WorkerState:
    queue: deque[int] = field(default_factory=deque)  # chains held, oldest first
    branches: set[int] = field(default_factory=set)  # branch prefixes held (never evicted)
    roots: set[int] = field(default_factory=set)
    event_id: int = 0  # of the last batch sent


@dataclass(frozen=True)
class Built:
    """One encoded batch, ready to publish."""

    worker: int
    data: bytes
    block_events: int


class Fleet:
    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self.chains = Chains(spec)
        self.workers = [WorkerState() for _ in range(spec.workers)]
        self.next_chain = 0

    # ------------------------------------------------------------------ the state
    def _missing_prefix(self, w: int, branch: int) -> int:
        """How many leading prefix blocks of ``branch`` worker ``w`` already holds."""
        ws = self.workers[w]
        if branch in ws.branches:
            return self.spec.branch_blocks
        return 1 if branch % self.spec.roots in ws.roots else 0

    def _take(self, w: int, c: int) -> tuple[int, int | None]:
        """Worker ``w`` stores chain ``c``: (prefix blocks it held before, chain evicted)."""
        ws = self.workers[w]
        branch = self.chains.meta(c)[0]
        held = self._missing_prefix(w, branch)
        ws.branches.add(branch)
        ws.roots.add(branch % self.spec.roots)
        ws.queue.append(c)
        evicted = ws.queue.popleft() if c >= self.spec.chains and len(ws.queue) > 1 else None
        return held, evicted

    def _batches_of(self, c: int, w: int, stored: int, removed: int) -> int:
        return len(_cut_sizes(stored + removed, self._batch_blocks(c, w)))

    def _batch_blocks(self, c: int, w: int) -> int:
        s = self.spec
        span = s.max_batch_blocks - s.min_batch_blocks + 1
        return s.min_batch_blocks + (c * 2654435761 + w * 40503) % span

    def advance(self, to_chain: int) -> None:
        """Move the state to ``to_chain`` without building anything (another process built and
        sent those chains)."""
        s = self.spec
        for c in range(self.next_chain, to_chain):
            for w in self.chains.meta(c)[1]:
                held, evicted = self._take(w, c)
                stored = s.chain_blocks - held
                removed = s.tail_blocks if evicted is not None else 0
                self.workers[w].event_id += self._batches_of(c, w, stored, removed)
        self.next_chain = max(self.next_chain, to_chain)

    def held_chains(self) -> list[int]:
        """Chains some worker holds now."""
        return sorted({c for ws in self.workers for c in ws.queue})

    def holder_blocks(self) -> int:
        """Block events the fill and churn have left held (prefixes and chains' own blocks)."""
        s = self.spec
        total = 0
        for ws in self.workers:
            total += len(ws.roots) + len(ws.branches) * (s.branch_blocks - 1)
            total += len(ws.queue) * s.tail_blocks
        return total

    # ------------------------------------------------------------------ batches
    def build(self, to_chain: int, skip: frozenset[int] = frozenset()) -> list[Built]:
        """The batches of chains ``next_chain .. to_chain-1``, in chain order (each worker's in
        its own order), built worker by worker so only one worker's relay is alive at a time;
        workers in ``skip`` (departed) advance but send nothing."""
        steps: dict[int, list[int]] = {}
        for c in range(self.next_chain, to_chain):
            for w in self.chains.meta(c)[1]:
                steps.setdefault(w, []).append(c)
        keyed: list[tuple[int, int, int, Built]] = []
        now = time.time()
        for w, cs in steps.items():
            relay = self._relay(w)
            ws = self.workers[w]
            for c in cs:
                events = self._step_events(w, c)
                for k, piece in enumerate(_cut(events, self._batch_blocks(c, w))):
                    ws.event_id += 1
                    if w in skip:
                        continue
                    relayed = tuple(relay.relay(piece))
                    batch = KvEventBatch(worker_id(w), self.spec.model, ws.event_id, now, relayed)
                    n = sum(len(e.block_hashes) for e in piece)
                    keyed.append((c, w, k, Built(w, encode(batch), n)))
        self.next_chain = max(self.next_chain, to_chain)
        self.chains.forget_tails()
        keyed.sort(key=lambda x: x[:3])
        return [b for *_, b in keyed]

    def _relay(self, w: int) -> KvRelay:
        """The worker's relay, told what it held before (without sending that again): a worker
        that sent before has announced its shape already."""
        relay = KvRelay(fleet_hashing=True, branch_blocks=self.spec.branch_blocks)
        for branch in sorted(self.workers[w].branches):
            relay.relay([BlockStored(self.chains.prefix(branch), None)])
        return relay

    def _step_events(self, w: int, c: int) -> list[BlockStored | BlockRemoved]:
        branch = self.chains.meta(c)[0]
        held, evicted = self._take(w, c)
        prefix = self.chains.prefix(branch)
        run = prefix[held:] + self.chains.tail(c)
        parent = prefix[held - 1] if held else None
        out: list[BlockStored | BlockRemoved] = [BlockStored(run, parent)]
        if evicted is not None:
            out.append(BlockRemoved(tuple(reversed(self.chains.tail(evicted)))))
        return out


def _cut_sizes(total: int, size: int) -> list[int]:
    return [min(size, total - i) for i in range(0, total, size)]


def _cut(
    events: list[BlockStored | BlockRemoved], size: int
) -> Iterator[list[BlockStored | BlockRemoved]]:
    """Events as batches of ``size`` block events (the last one shorter); a stored run cut in two
    continues from its last block."""
    piece: list[BlockStored | BlockRemoved] = []
    room = size
    for ev in events:
        hashes = ev.block_hashes
        parent = ev.parent_block_hash if isinstance(ev, BlockStored) else None
        while hashes:
            part, hashes = hashes[:room], hashes[room:]
            if isinstance(ev, BlockStored):
                piece.append(BlockStored(part, parent))
                parent = part[-1]
            else:
                piece.append(BlockRemoved(part))
            room -= len(part)
            if room == 0:
                yield piece
                piece, room = [], size
    if piece:
        yield piece


def prompt(chains: Chains, c: int, n_blocks: int, rng: random.Random) -> tuple[int, ...]:
    """A request of ``n_blocks`` blocks: a prefix of chain ``c`` (from its branch point to the
    whole chain, at most ``n_blocks``) and a fresh suffix."""
    s = chains.spec
    blocks = chains.blocks(c)
    held = rng.randint(min(s.branch_blocks, n_blocks), min(len(blocks), n_blocks))
    out = list(blocks[:held])
    parent = out[-1] if out else None
    while len(out) < n_blocks:
        parent = chain_hash(parent, rng.getrandbits(64), 0, s.branch_blocks)
        out.append(parent)
    return tuple(out)
