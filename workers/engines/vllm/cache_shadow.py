"""What vLLM's prefix cache holds, rebuilt from the KV events the worker forwarded. Pure.

vLLM has no API that lists its cached blocks, yet the fleet needs two things only such a list
gives:

- **resync** (control op ``kv_resync``): a KV indexer that lost this worker's events drops its
  entries and asks for the whole cache again. The shadow answers with ``AllBlocksCleared`` and
  then ``BlockStored`` runs, parents first, as the mocker does from its block pool.
- **consistency after lost events**: when events were lost for good (replay could not fill a
  gap) the worker forwards ``AllBlocksCleared`` while vLLM still holds blocks. A later
  ``BlockStored`` extending such an unseen block would reach the indexer with an unknown parent,
  which it treats as a gap (drop + resync), again and again. The shadow forwards a ``BlockStored``
  only when its parent is the root or a block it holds, and drops the others (``orphans``): what
  the fleet sees is always a subset of what vLLM holds, never a chain it cannot place.

Each tier (``medium``: GPU, and CPU or DISK with vLLM's offloading) is shadowed on its own; a
stored block's parent may be in any of them, and a resync republishes every tier, GPU first.
Removals are forwarded only for blocks the shadow holds. Token ids are kept as ``array('I')``
(4 bytes per token), so a shadow of 100k blocks of 16 tokens costs about 6 MiB of tokens.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from schemas.kv_events import (
    GPU,
    OFFLOAD_MEDIA,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvCacheEvent,
    Medium,
)


@dataclass(frozen=True, slots=True)
class _Block:
    parent: int | None
    tokens: array[int]
    block_size: int
    lora_name: str | None


class CacheShadow:
    def __init__(self) -> None:
        self._tiers: dict[Medium, dict[int, _Block]] = {m: {} for m in (GPU, *OFFLOAD_MEDIA)}
        self._blocks = self._tiers[GPU]
        self.orphans = 0  # BlockStored runs dropped because their parent was unknown

    def __len__(self) -> int:
        """Blocks in GPU memory."""
        return len(self._blocks)

    def __contains__(self, engine_hash: object) -> bool:
        return engine_hash in self._blocks

    def held(self, medium: Medium) -> int:
        """Blocks of a tier."""
        return len(self._tiers[medium])

    def _known(self, engine_hash: int) -> bool:
        return any(engine_hash in t for t in self._tiers.values())

    def apply(self, events: Iterable[KvCacheEvent]) -> list[KvCacheEvent]:
        """Apply vLLM's events; return the ones to forward to the fleet (see module docstring)."""
        out: list[KvCacheEvent] = []
        for ev in events:
            if isinstance(ev, BlockStored):
                if self._store(ev):
                    out.append(ev)
            elif isinstance(ev, BlockRemoved):
                tier = self._tiers[ev.medium]
                known = tuple(h for h in ev.block_hashes if tier.pop(h, None) is not None)
                if known:
                    out.append(BlockRemoved(known, ev.medium))
            else:
                for medium, tier in self._tiers.items():
                    if ev.medium in (None, medium):
                        tier.clear()
                out.append(ev)
        return out

    def _store(self, ev: BlockStored) -> bool:
        if ev.parent_block_hash is not None and not self._known(ev.parent_block_hash):
            self.orphans += 1
            return False
        bs = ev.block_size
        parent = ev.parent_block_hash
        tier = self._tiers[ev.medium]
        for i, h in enumerate(ev.block_hashes):
            tokens = ev.token_ids[i * bs : (i + 1) * bs]
            if len(tokens) < bs:
                break
            tier[h] = _Block(parent, array("I", tokens), bs, ev.lora_name)
            parent = h
        return True

    def snapshot_events(self, max_tokens: int = 65536) -> Iterator[list[KvCacheEvent]]:
        """The whole cache as event lists of at most ~``max_tokens`` tokens each: first
        ``AllBlocksCleared``, then runs of ``BlockStored``, every block after its parent.
        Blocks whose parent is gone are unreachable by prefix and left out."""
        chunk: list[KvCacheEvent] = [AllBlocksCleared()]
        size = 0
        emitted: set[int] = set()  # a block of one tier may hang off a block of another
        runs = (run for medium in self._tiers for run in self._runs(medium, emitted, max_tokens))
        for run in runs:
            chunk.append(run)
            size += len(run.token_ids)
            if size >= max_tokens:
                yield chunk
                chunk, size = [], 0
        if chunk:
            yield chunk

    def _runs(self, medium: Medium, emitted: set[int], max_tokens: int) -> Iterator[BlockStored]:
        """Runs of a tier's blocks not emitted yet whose parent is emitted (or the root). Walks
        start at the newest blocks, usually leaves, so a whole chain tends to come out as one
        run."""
        blocks = self._tiers[medium]
        done: set[int] = set()  # this tier's
        broken: set[int] = set()
        for start in reversed(list(blocks)):
            chain: list[int] = []
            on_chain: set[int] = set()
            h: int | None = start
            while h is not None and h not in done and h not in broken and h not in on_chain:
                if h in emitted and h not in blocks:
                    break  # the parent, emitted in another tier
                block = blocks.get(h)
                if block is None:  # an ancestor was evicted: the chain below is unreachable
                    break
                chain.append(h)
                on_chain.add(h)
                h = block.parent
            if h is not None and h not in done and h not in emitted:  # a missing or broken one
                broken.update(chain)
                continue
            chain.reverse()
            done.update(chain)
            emitted.update(chain)
            yield from self._split(blocks, medium, chain, max_tokens)

    @staticmethod
    def _split(
        blocks: dict[int, _Block], medium: Medium, chain: Sequence[int], max_tokens: int
    ) -> Iterator[BlockStored]:
        """One ``BlockStored`` per stretch of ``chain`` sharing block size and adapter, each of
        at most ``max_tokens`` tokens (at least one block)."""
        i = 0
        while i < len(chain):
            first = blocks[chain[i]]
            max_blocks = max(1, max_tokens // first.block_size)
            j = i + 1
            while j < len(chain) and j - i < max_blocks:
                b = blocks[chain[j]]
                if b.block_size != first.block_size or b.lora_name != first.lora_name:
                    break
                j += 1
            tokens: list[int] = []
            for h in chain[i:j]:
                tokens.extend(blocks[h].tokens)
            yield BlockStored(
                tuple(chain[i:j]),
                first.parent,
                tuple(tokens),
                first.block_size,
                first.lora_name,
                medium,
            )
            i = j
