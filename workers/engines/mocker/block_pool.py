"""KV block pool with prefix caching and LRU eviction; queues KV events for the service to publish.

Every block has a reference count (the sequences using it). Life of a block:

1. ``allocate(n)`` hands out free blocks with one reference each. Free blocks are reused from the
   front of one ordered free list: uncommitted blocks first, then cached ones least recently freed
   first (LRU). Reusing a cached block evicts it: ``BlockRemoved`` is queued (one event per call).
2. When a sequence fills a block, the scheduler ``commit``s it: the block gets the fleet's chained
   hash (``schemas.hashing.block_hashes``), is registered in the cache, and ``BlockStored`` is
   queued. Consecutive blocks of one sequence committed together go in one event, with the hash
   of the block before them as ``parent_block_hash``. Content already cached in another block is
   not registered twice (that copy stays private to its sequence and is freed uncached).
3. ``match_prefix`` finds the cached leading blocks of a hash chain; ``take`` adds a reference to
   them (a cache hit, which also takes a free cached block off the free list).
4. ``free`` drops a reference. A block nobody uses joins the free list: a cached one at the back
   (most recently used; a sequence's tail blocks are freed first so its head outlives them, as
   in vLLM), an uncommitted one at the front.

The host tier (``num_cpu_blocks`` > 0, a second, slower level of the cache): a cached block that
``allocate`` evicts is copied there first (``BlockStored`` with ``medium="CPU"``), and the tier
drops its least recently used block when full (``BlockRemoved``, ``CPU``). ``match_host`` finds
how many of a chain's next blocks it holds; ``touch_host`` marks them used (the scheduler loads
them back into fresh GPU blocks and commits those, so they are cached on the GPU again; the host
copy stays). A block whose parent is in neither tier is not copied: no prefix match can reach
it. Within one ``allocate``, the host copies are announced before the GPU removals, so a reader
applying events in order always knows a copied block's parent.

``reset_prefix_cache`` forgets every cached block of both tiers when no block is in use
(``AllBlocksCleared``).
``take_events`` drains the outbox, as vLLM's ``KVCacheManager.take_events()`` does; this module
does no I/O. Every operation is O(blocks touched).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from schemas.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvCacheEvent

_Meta = tuple[int | None, tuple[int, ...], str | None]  # parent hash, token ids, LoRA


class BlockPool:
    """``num_blocks`` KV blocks of ``block_size`` tokens; see the module docstring."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        num_cpu_blocks: int = 0,
    ) -> None:
        self.num_blocks = num_blocks
        self.num_cpu_blocks = num_cpu_blocks if enable_caching else 0
        self.block_size = block_size
        self.enable_caching = enable_caching
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}  # block hash -> block id
        self._meta: dict[int, _Meta] = {}  # by hash
        self._host: OrderedDict[int, _Meta] = OrderedDict()  # host tier by hash, LRU first
        # free block ids put back, front = reused first. The blocks never handed out are not
        # listed: they are ``range(self._fresh, num_blocks)``, reused after the uncommitted
        # blocks put back at the front and before the cached ones at the back (a list of every
        # block built up front took 25 ms and 2.5 MB per pool: a process of 1,024 mocker workers
        # spent 26 s and 2.5 GB on them)
        self._free: OrderedDict[int, None] = OrderedDict()
        self._fresh = 0  # the first block never handed out
        self._events: list[KvCacheEvent] = []

    # ---------------------------------------------------------------- queries
    @property
    def num_free(self) -> int:
        """Blocks with no reference (cached or not): what ``allocate`` can hand out."""
        return len(self._free) + self.num_blocks - self._fresh

    @property
    def num_used(self) -> int:
        """Blocks referenced by at least one sequence."""
        return self._fresh - len(self._free)

    @property
    def usage(self) -> float:
        """``num_used`` as a fraction of all blocks, 0..1."""
        return self.num_used / self.num_blocks

    @property
    def num_cached(self) -> int:
        """Blocks registered in the prefix cache (in use or free)."""
        return len(self._cached)

    @property
    def num_host_cached(self) -> int:
        """Blocks in the host tier."""
        return len(self._host)

    def match_host(self, hashes: Sequence[int]) -> int:
        """How many leading ``hashes`` the host tier holds (does not touch them)."""
        n = 0
        for h in hashes:
            if h not in self._host:
                break
            n += 1
        return n

    def touch_host(self, hashes: Sequence[int]) -> None:
        """Mark host blocks used (loaded back): the last to be dropped."""
        for h in hashes:
            self._host.move_to_end(h)

    def block_hash(self, block_id: int) -> int | None:
        return self._hash[block_id]

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    def count_unreferenced(self, block_ids: Sequence[int]) -> int:
        """How many of ``block_ids`` are free (``take`` would remove them from the free list)."""
        ref = self._ref
        return sum(1 for b in block_ids if ref[b] == 0)

    def match_prefix(self, hashes: Sequence[int]) -> list[int]:
        """Block ids of the leading ``hashes`` present in the cache (does not take them)."""
        if not self.enable_caching:
            return []
        out: list[int] = []
        for h in hashes:
            b = self._cached.get(h)
            if b is None:
                break
            out.append(b)
        return out

    # ---------------------------------------------------------------- mutations
    def take(self, block_ids: Sequence[int]) -> None:
        """Add a reference to blocks found by ``match_prefix`` (a cache hit)."""
        for b in block_ids:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1

    def allocate(self, n: int) -> list[int] | None:
        """``n`` fresh blocks (evicting cached free ones, LRU first), or None if too few."""
        if n > self.num_free:
            return None
        out: list[int] = []
        evicted: list[int] = []
        for _ in range(n):
            b = self._pop_free()
            h = self._hash[b]
            if h is not None:
                if self.num_cpu_blocks:
                    self._offload(h, self._meta[h])
                del self._cached[h]
                del self._meta[h]
                self._hash[b] = None
                evicted.append(h)
            self._ref[b] = 1
            out.append(b)
        if evicted:
            self._events.append(BlockRemoved(tuple(evicted)))
        return out

    def _pop_free(self) -> int:
        """The next free block: an uncommitted one put back, else one never handed out, else
        the least recently used cached one (there is one: ``allocate`` counted them)."""
        if self._free:
            b = next(iter(self._free))
            if self._hash[b] is None or self._fresh == self.num_blocks:
                del self._free[b]
                return b
        b, self._fresh = self._fresh, self._fresh + 1
        return b

    def _offload(self, h: int, meta: _Meta) -> None:
        """Copy an evicted GPU block into the host tier (see the module docstring)."""
        host = self._host
        if h in host:
            host.move_to_end(h)
            return
        if len(host) >= self.num_cpu_blocks:
            old, _ = host.popitem(last=False)
            self._events.append(BlockRemoved((old,), medium="CPU"))
        parent, tokens, lora = meta
        if parent is not None and parent not in self._cached and parent not in host:
            return  # unreachable by prefix: not worth a copy
        host[h] = meta
        self._events.append(BlockStored((h,), parent, tokens, self.block_size, lora, "CPU"))

    def free(self, block_ids: Sequence[int]) -> None:
        """Drop one reference from each block; the tail of a sequence is evicted first."""
        for b in reversed(block_ids):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None
                if self._hash[b] is None:
                    self._free.move_to_end(b, last=False)  # nothing cached: reuse first

    def commit(
        self,
        block_ids: Sequence[int],
        hashes: Sequence[int],
        token_ids: Sequence[int],
        parent_hash: int | None,
        lora_name: str | None = None,
    ) -> None:
        """Register newly full blocks (``token_ids`` = their tokens, in order) in the cache."""
        if not self.enable_caching or not block_ids:
            return
        bs = self.block_size
        run_hashes: list[int] = []
        run_start = 0
        parent = parent_hash
        for i, (b, h) in enumerate(zip(block_ids, hashes, strict=True)):
            if h in self._cached or self._hash[b] is not None:
                # the same content is cached in another block already: this copy stays private
                self._flush_run(run_hashes, token_ids, run_start, parent, lora_name)
                run_hashes = []
                run_start = (i + 1) * bs
                parent = h
                continue
            self._cached[h] = b
            self._hash[b] = h
            self._meta[h] = (
                parent if not run_hashes else run_hashes[-1],
                tuple(token_ids[i * bs : (i + 1) * bs]),
                lora_name,
            )
            run_hashes.append(h)
        self._flush_run(run_hashes, token_ids, run_start, parent, lora_name)

    def _flush_run(
        self,
        hashes: list[int],
        token_ids: Sequence[int],
        start: int,
        parent: int | None,
        lora_name: str | None,
    ) -> None:
        if hashes:
            end = start + len(hashes) * self.block_size
            self._events.append(
                BlockStored(
                    tuple(hashes), parent, tuple(token_ids[start:end]), self.block_size, lora_name
                )
            )

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; refused (False) while any block is in use."""
        if self.num_used:
            return False
        self._cached.clear()
        self._meta.clear()
        self._host.clear()
        self._hash = [None] * self.num_blocks
        self._events.append(AllBlocksCleared())
        return True

    def snapshot_events(self) -> list[KvCacheEvent]:
        """The whole cache as events: ``AllBlocksCleared``, then a ``BlockStored`` per cached
        block, parents first, for a consumer that lost track of this pool (indexer gap healing).
        Blocks whose chain is broken (a parent evicted) are unreachable by prefix and left out."""
        events: list[KvCacheEvent] = [AllBlocksCleared()]
        emitted: set[int] = set()
        broken: set[int] = set()
        for start in list(self._meta):
            chain: list[int] = []
            h: int | None = start
            while h is not None and h not in emitted and h not in broken:
                if h not in self._meta:  # parent evicted: the whole chain below is unreachable
                    broken.update(chain)
                    chain = []
                    break
                chain.append(h)
                h = self._meta[h][0]
            if h is not None and h in broken:
                broken.update(chain)
                continue
            for c in reversed(chain):
                parent, tokens, lora = self._meta[c]
                events.append(BlockStored((c,), parent, tokens, self.block_size, lora))
                emitted.add(c)
        # the host tier: a block goes out once its parent has (one pass per level of the chains)
        pending = list(self._host)
        while pending:
            later: list[int] = []
            for h in pending:
                parent, tokens, lora = self._host[h]
                if parent is None or parent in emitted:
                    events.append(BlockStored((h,), parent, tokens, self.block_size, lora, "CPU"))
                else:
                    later.append(h)
            if len(later) == len(pending):
                break  # the rest hang off blocks neither tier holds: unreachable by prefix
            waiting = set(later)
            emitted.update(h for h in pending if h not in waiting)
            pending = later
        return events

    def take_events(self) -> list[KvCacheEvent]:
        events, self._events = self._events, []
        return events
