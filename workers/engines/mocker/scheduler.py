"""The mocker's continuous-batching scheduler (vLLM v1-like), a pure core driven by ``step()``.

Each step, with a token budget of ``max_num_batched_tokens``:

1. **Running sequences first**, in admission order: a decoding sequence computes 1 token; one
   still prefilling (chunked prefill, or a recompute) computes as much as the budget allows.
   A sequence that needs a new block and finds none **preempts** the most recently admitted
   running sequence (recompute mode, as vLLM v1: its blocks are freed — full ones stay in the
   prefix cache — and it goes back to the *front* of the waiting queue), or itself if it is the
   newest. Victims come from the back of the running list, so they were not scheduled yet.
2. **Waiting sequences** are admitted in order (only in a step without preemption) while there
   are sequence slots (``max_num_seqs``), budget, and free blocks above the watermark
   (``watermark`` of the pool, kept only while other sequences run). At admission the longest
   cached prefix of full blocks is reused; at least the last token is always computed, as in
   vLLM, so a fully cached prompt recomputes its last block. Without chunked prefill a prompt
   that does not fit the remaining budget waits for a later step.
3. **Execution**: every scheduled sequence advances; blocks it filled are committed to the prefix
   cache (``BlockStored``). A sequence whose tokens are all computed samples one token from
   ``token_source(seed, position)`` — the first one in the step that completes its prefill —
   and finishes (``"length"``) after ``max_tokens`` tokens, or (``"stop"``) on one of its
   ``stop_token_ids`` once it has ``min_tokens``. A sequence with ``forced`` tokens
   (structured output) emits those instead and finishes (``"stop"``) after the last one; an
   ``embed`` sequence finishes (``"stop"``, no token) once its prompt is computed. The
   step's simulated duration is ``timing.step_ms`` (see ``timing`` for how prefill and decode
   combine).

**Disaggregation.** A sequence with ``remote_prompt`` tokens (decode side) is admitted with
blocks for its whole prompt at once and then *waits for remote KV*: it is running (it holds its
blocks and a slot) but computes nothing until the transfer ends. Its bytes are the blocks to move
(every prompt block, or under ``destination_missing`` only those not already cached here) times
``block_bytes``; the worker's link (``kv_transfer_bandwidth``) is shared fairly by the transfers
in flight, and they progress during every step (compute and transfer overlap). A step with
nothing to compute lasts until the next transfer completes. A completed transfer commits the
prompt's blocks (``BlockStored``) and the sequence continues as if it had prefilled (the last
prompt token it computes itself is charged as a decode token, batched with the others, as vLLM
does, not as a prefill of its own); a preempted
one recomputes locally later (its KV is gone). A sequence with ``hold`` (prefill side) keeps its
blocks after finishing until ``release_held``.

A request that could never run — ``prompt + max_tokens - 1`` tokens of KV above the pool, or,
without chunked prefill, above the token budget (vLLM requires ``max_num_batched_tokens >=
max_model_len`` then) — is finished with ``"error"`` at the next step instead of waiting forever.
Evictions queue ``BlockRemoved``; the async engine drains events with ``take_events()``.
No I/O, no clock, no randomness: the same calls give the same outputs. Each step is
O(scheduled sequences + blocks touched).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import xxhash

from schemas.kv_events import KvCacheEvent
from workers.engines.mocker.block_pool import BlockPool
from workers.engines.mocker.config import MockerConfig
from workers.engines.mocker.sequence import SeqRequest, SeqStatus, Sequence
from workers.engines.mocker.timing import step_ms

TokenSource = Callable[[int, int], int]  # (seed, output position) -> token id

__all__ = [
    "Scheduler",
    "SchedulerStats",
    "SeqOutput",
    "SeqRequest",
    "StepResult",
    "TokenSource",
    "default_token_source",
]

_U64 = 0xFFFFFFFFFFFFFFFF


class SeqOutput(NamedTuple):  # immutable and ~5x cheaper to build than a frozen dataclass
    request_id: str
    new_token_ids: tuple[int, ...]  # 0 or 1 token
    finished: bool
    finish_reason: str | None  # "length" | "stop" (forced text done) | "error" (rejected) | None
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens served by the prefix cache at first admission
    num_output_tokens: int  # generated so far, this token included
    num_host_tokens: int = 0  # of num_cached_tokens, loaded back from the host tier


@dataclass(frozen=True, slots=True)
class StepResult:
    simulated_ms: float  # timing model, before speedup
    outputs: list[SeqOutput] = field(default_factory=list)
    num_prefill_tokens: int = 0  # tokens computed by prefilling sequences
    num_decode_seqs: int = 0  # sequences that computed just their last sampled token
    preempted: tuple[str, ...] = ()  # request ids preempted in this step
    transfers_done: tuple[tuple[str, float], ...] = ()  # (request id, transfer ms) completed


def _share_link(
    active: list[Sequence],
    ms: float,
    bytes_per_ms: float,
    left: Callable[[Sequence], float],
    spend: Callable[[Sequence, float, float], None],
    land: Callable[[Sequence], None],
) -> tuple[float, list[Sequence]]:
    """``ms`` of a link shared fairly by the copies in flight (``left``: bytes still to move;
    ``spend(seq, bytes, ms)`` moves them; ``land`` ends a copy, in the order they finish): the
    time no copy used, and the copies still in flight."""
    rest = ms
    while active and rest > 1e-12:
        share = bytes_per_ms / len(active)  # bytes per ms each
        dt = min(min(left(s) for s in active) / share, rest)
        for s in active:
            spend(s, share * dt, dt)
        rest -= dt
        for s in [s for s in active if left(s) <= 1e-6]:
            land(s)
        active = [s for s in active if left(s) > 1e-6]
    return rest, active


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    num_running: int
    num_waiting: int  # incl. preempted sequences waiting for recompute
    kv_usage: float  # fraction of blocks referenced by live sequences, 0..1
    num_free_blocks: int  # unreferenced blocks (cached ones included)
    active_decode_blocks: int  # blocks referenced by running sequences
    active_prefill_tokens: int  # tokens still to prefill (waiting + running)
    num_preempted_total: int
    prompt_tokens_total: int  # prompt tokens of admitted requests
    cached_tokens_total: int  # of which served by the prefix cache
    num_transferring: int = 0  # sequences waiting for remote KV
    num_held_blocks: int = 0  # blocks kept for remote decodes that have not pulled them yet
    host_cached_tokens_total: int = 0  # of cached_tokens_total, loaded from the host tier
    num_host_blocks: int = 0  # blocks in the host tier


def default_token_source(seed: int, position: int) -> int:
    """ASCII letters a..z (97..122), a pure function of (seed, position)."""
    return 97 + xxhash.xxh3_64_intdigest(position.to_bytes(8, "little"), seed & _U64) % 26


class Scheduler:
    def __init__(
        self, config: MockerConfig, token_source: TokenSource = default_token_source
    ) -> None:
        self.config = config
        self._bs = config.block_size
        self._branch = config.kv_branch_blocks
        self._caching = config.enable_prefix_caching
        self.pool = BlockPool(
            config.num_gpu_blocks,
            config.block_size,
            config.enable_prefix_caching,
            config.num_cpu_blocks,
        )
        self._token_source = token_source
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: the last is preempted first
        self._seqs: dict[str, Sequence] = {}  # live (waiting, running or rejected) by request id
        self._rejected: list[Sequence] = []
        self._preempted_total = 0
        self._prompt_total = 0
        self._cached_total = 0
        self._held: dict[str, list[int]] = {}  # request id -> blocks kept for a remote decode
        self._bytes_per_ms = config.kv_transfer_bandwidth * 1e6  # GB/s = 1e6 bytes per ms
        self._load_bytes_per_ms = config.kv_offload_bandwidth * 1e6  # the host-to-GPU link
        self._host_total = 0  # prompt tokens loaded back from the host tier

    # ------------------------------------------------------------------ requests
    def add_request(self, req: SeqRequest) -> None:
        if req.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if req.request_id in self._seqs:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        seq = Sequence.new(req)
        self._seqs[req.request_id] = seq
        if self._never_fits(len(req.prompt_token_ids) + req.max_tokens - 1):
            self._rejected.append(seq)
        else:
            self._enqueue(seq, front=False)

    def _enqueue(self, seq: Sequence, front: bool) -> None:
        """Into the waiting queue by priority (lower first): behind its equals (a new one), or
        ahead of them (a preempted one)."""
        waiting, p = self.waiting, seq.req.priority
        if not waiting or (not front and waiting[-1].req.priority <= p):
            waiting.append(seq)  # the common case: everyone at one priority
            return
        for i, other in enumerate(waiting):
            if other.req.priority > p or (front and other.req.priority == p):
                waiting.insert(i, seq)
                return
        waiting.append(seq)

    def _never_fits(self, kv_tokens: int) -> bool:
        """More KV than the pool, or (without chunked prefill) a recompute above the budget."""
        cfg = self.config
        if -(-kv_tokens // self._bs) > cfg.num_gpu_blocks:
            return True
        return not cfg.enable_chunked_prefill and kv_tokens > cfg.max_num_batched_tokens

    def release_held(self, request_id: str) -> bool:
        """Free the blocks a finished ``hold`` request kept (the decode side pulled them, or
        gave up); False if none are held for it."""
        blocks = self._held.pop(request_id, None)
        if blocks is None:
            return False
        self.pool.free(blocks)
        return True

    def abort(self, request_id: str) -> bool:
        """Drop a live request and free its blocks (full ones stay cached)."""
        if self.release_held(request_id):
            return True
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return False
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
            self.pool.free(seq.block_ids)
        elif seq in self._rejected:
            self._rejected.remove(seq)
        else:
            self.waiting.remove(seq)
        seq.status = SeqStatus.FINISHED
        return True

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self._rejected)

    def reset_prefix_cache(self) -> bool:
        """Forget the prefix cache (``AllBlocksCleared``); False while any block is in use."""
        return self.pool.reset_prefix_cache()

    def take_events(self) -> list[KvCacheEvent]:
        return self.pool.take_events()

    def snapshot_events(self) -> list[KvCacheEvent]:
        """The whole cache as events, for a consumer that lost track (see ``BlockPool``)."""
        return self.pool.snapshot_events()

    # ------------------------------------------------------------------ one step
    def step(self) -> StepResult:
        if not self.has_work:
            return StepResult(0.0)
        outputs = self._finish_rejected()
        scheduled: list[tuple[Sequence, int]] = []
        preempted: list[str] = []
        budget = self._schedule_running(self.config.max_num_batched_tokens, scheduled, preempted)
        if not preempted:
            self._schedule_waiting(budget, scheduled)
        result = self._execute(scheduled, preempted, outputs)
        transferring = [s for s in self.running if s.transfer_left > 0]
        loading = [s for s in self.running if s.load_left > 0]
        if not transferring and not loading:
            return result
        ms = result.simulated_ms
        if not scheduled:  # nothing computes: the step lasts until the next copy lands
            waits = []  # fair shares: the first to land does so after min left x count / link
            if transferring:
                first = min(s.transfer_left for s in transferring)
                waits.append(first * len(transferring) / self._bytes_per_ms)
            if loading:
                first = min(s.load_left for s in loading)
                waits.append(first * len(loading) / self._load_bytes_per_ms)
            ms = min(waits)
        if loading:
            self._advance_loads(loading, ms)
        done = self._advance_transfers(transferring, ms) if transferring else []
        return StepResult(
            ms,
            result.outputs,
            result.num_prefill_tokens,
            result.num_decode_seqs,
            result.preempted,
            tuple(done),
        )

    def _advance_transfers(self, active: list[Sequence], ms: float) -> list[tuple[str, float]]:
        """Move ``ms`` of fair-shared link time into the transfers in flight; the completed
        ones commit their prompt blocks and are ready to decode."""
        done: list[tuple[str, float]] = []

        def spend(s: Sequence, moved: float, dt: float) -> None:
            s.transfer_left -= moved
            s.transfer_ms += dt

        def land(s: Sequence) -> None:
            self._land(s)
            done.append((s.request_id, s.transfer_ms))

        rest, waiting = _share_link(
            active, ms, self._bytes_per_ms, lambda s: s.transfer_left, spend, land
        )
        for s in waiting:  # a step with nothing moving still counts as waiting time
            s.transfer_ms += rest
        return done

    def _advance_loads(self, active: list[Sequence], ms: float) -> None:
        """Move ``ms`` of the host-to-GPU link into the loads in flight (fair share, as
        ``_advance_transfers``); a landed load's blocks count as computed and are committed."""

        def spend(s: Sequence, moved: float, dt: float) -> None:
            s.load_left -= moved

        def land(s: Sequence) -> None:
            s.load_left = 0.0
            s.num_computed += s.load_tokens
            s.load_tokens = 0
            if s.num_computed // self._bs > s.num_committed:
                self._commit(s)  # cached on the GPU again

        _share_link(active, ms, self._load_bytes_per_ms, lambda s: s.load_left, spend, land)

    def _land(self, seq: Sequence) -> None:
        seq.transfer_left = 0.0
        seq.transferred = True
        seq.num_computed = max(seq.num_computed, seq.req.remote_prompt)
        if seq.num_computed // self._bs > seq.num_committed:
            self._commit(seq)

    def _chunk(self, todo: int, budget: int) -> int:
        """Tokens to compute now out of ``todo`` (0: wait for a step with more budget)."""
        if todo <= budget:
            return todo
        return budget if self.config.enable_chunked_prefill else 0

    def _schedule_running(
        self, budget: int, scheduled: list[tuple[Sequence, int]], preempted: list[str]
    ) -> int:
        running, bs = self.running, self._bs
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            i += 1
            if seq.transfer_left > 0 or seq.load_left > 0:
                continue  # waiting for its remote KV, or for its blocks from the host tier
            n = self._chunk(len(seq.tokens) - seq.num_computed, budget)
            if n == 0:
                continue
            if seq.num_computed + n > len(seq.block_ids) * bs and not self._reserve(
                seq, n, preempted
            ):
                break  # seq preempted itself: it was the last running one
            scheduled.append((seq, n))
            budget -= n
        return budget

    def _reserve(self, seq: Sequence, n: int, preempted: list[str]) -> bool:
        """Blocks for ``n`` more tokens of ``seq``, preempting the newest sequences if needed."""
        need = seq.blocks_needed(self._bs, n)
        while True:
            blocks = self.pool.allocate(need)
            if blocks is not None:
                seq.block_ids.extend(blocks)
                return True
            victim = self._victim()
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is seq:
                return False

    def _victim(self) -> Sequence:
        """The sequence preempted for room: the newest of the lowest priority (the newest of
        all when every one has the same)."""
        running = self.running
        worst = max(s.req.priority for s in running)
        for i in range(len(running) - 1, -1, -1):
            if running[i].req.priority == worst:
                return running.pop(i)
        return running.pop()

    def _preempt(self, seq: Sequence) -> None:
        self.pool.free(seq.block_ids)
        seq.reset_for_recompute()
        self._enqueue(seq, front=True)
        self._preempted_total += 1

    def _schedule_waiting(self, budget: int, scheduled: list[tuple[Sequence, int]]) -> None:
        waiting, running = self.waiting, self.running
        while waiting and budget > 0 and len(running) < self.config.max_num_seqs:
            seq = waiting[0]
            if seq.req.remote_prompt and not seq.transferred:
                if not self._admit_remote(seq):
                    break
                waiting.popleft()
                running.append(seq)
                continue
            n = self._admit(seq, budget)
            if n == 0:
                break
            waiting.popleft()
            running.append(seq)
            if seq.load_left > 0:
                continue  # computes once its blocks are back from the host tier
            scheduled.append((seq, n))
            budget -= n

    def _admit_remote(self, seq: Sequence) -> bool:
        """Blocks for the whole remote prompt (its cached prefix reused), and the transfer of
        the blocks to move; False when they do not fit now."""
        bs, pool, remote = self._bs, self.pool, seq.req.remote_prompt
        cached = (
            pool.match_prefix(seq.hashes_upto(bs, remote // bs, self._branch))
            if self._caching
            else []
        )
        prompt_blocks = -(-remote // bs)
        need = max(-(-len(seq.tokens) // bs), prompt_blocks) - len(cached)
        reserve = self.config.watermark_blocks if self.running else 0
        if pool.num_free - pool.count_unreferenced(cached) - need < reserve:
            return False
        pool.take(cached)
        blocks = pool.allocate(need)
        assert blocks is not None  # checked above
        seq.block_ids = [*cached, *blocks]
        seq.num_computed = len(cached) * bs
        seq.num_committed = len(cached)
        seq.status = SeqStatus.RUNNING
        seq.num_cached_tokens = len(cached) * bs
        self._prompt_total += seq.num_prompt
        self._cached_total += seq.num_cached_tokens
        move = prompt_blocks
        if self.config.kv_transfer_mode == "destination_missing":
            move -= len(cached)
        seq.transfer_left = float(move * self.config.block_bytes)
        if move == 0:
            self._land(seq)
        return True

    def _admit(self, seq: Sequence, budget: int) -> int:
        """Give ``seq`` its cached prefix (GPU, then the host tier's next blocks, loaded back)
        and blocks for its first chunk; the chunk's tokens (0: it does not fit now, nothing
        changed)."""
        bs, pool = self._bs, self.pool
        hashes = seq.hashes_upto(bs, None, self._branch) if self._caching else []
        cached = pool.match_prefix(hashes) if hashes else []
        n_host = pool.match_host(hashes[len(cached) :]) if pool.num_cpu_blocks else 0
        if (len(cached) + n_host) * bs >= len(seq.tokens):  # compute at least the last token
            if n_host:
                n_host -= 1
            else:
                cached = cached[:-1]
        cached_tokens = (len(cached) + n_host) * bs
        n = self._chunk(len(seq.tokens) - cached_tokens, budget)
        if n == 0:
            return 0
        need = -(-(cached_tokens + n) // bs) - len(cached)
        reserve = self.config.watermark_blocks if self.running else 0
        if pool.num_free - pool.count_unreferenced(cached) - need < reserve:
            return 0
        pool.take(cached)
        if n_host:  # marked used before the allocation can push them out of the host tier
            pool.touch_host(hashes[len(cached) : len(cached) + n_host])
        blocks = pool.allocate(need)
        assert blocks is not None  # checked above
        seq.block_ids = [*cached, *blocks]
        seq.num_computed = len(cached) * bs
        seq.num_committed = len(cached)
        # the host blocks come back over the host-to-GPU link while others compute (vLLM's
        # offloading loads asynchronously too); the sequence waits, as for remote KV
        seq.load_tokens = n_host * bs
        seq.load_left = float(n_host * self.config.block_bytes)
        seq.status = SeqStatus.RUNNING
        if seq.num_cached_tokens < 0:  # first admission, not a recompute after preemption
            seq.num_cached_tokens = cached_tokens
            seq.num_host_tokens = n_host * bs
            self._prompt_total += seq.num_prompt
            self._cached_total += cached_tokens
            self._host_total += n_host * bs
        return n

    def _execute(
        self,
        scheduled: list[tuple[Sequence, int]],
        preempted: list[str],
        outputs: list[SeqOutput],
    ) -> StepResult:
        usage = self.pool.usage  # after this step's allocations, before finished ones free
        prefill_chunks: list[int] = []
        sampled = finished = False
        bs = self._bs
        for seq, n in scheduled:
            todo = len(seq.tokens) - seq.num_computed
            # Sequence.prefilling, inlined (hot loop). The one prompt token a remotely
            # prefilled sequence computes rides in the decode batch, as in vLLM: no prefill cost.
            if (todo > 1 or not seq.output) and not (n == 1 and seq.transferred):
                prefill_chunks.append(n)
            seq.num_computed += n
            if seq.num_computed // bs > seq.num_committed:
                self._commit(seq)
            if n < todo:
                continue  # a prefill chunk: no token yet
            sampled = True
            outputs.append(self._sample(seq))
            finished = finished or seq.status is SeqStatus.FINISHED
        if finished:
            self.running = [s for s in self.running if s.status is SeqStatus.RUNNING]
        return StepResult(
            simulated_ms=step_ms(prefill_chunks, sampled, usage),
            outputs=outputs,
            num_prefill_tokens=sum(prefill_chunks),
            num_decode_seqs=len(scheduled) - len(prefill_chunks),
            preempted=tuple(preempted),
        )

    def _sample(self, seq: Sequence) -> SeqOutput:
        req = seq.req
        if req.embed:  # the prompt is computed: that is all an embedding needs
            seq.status = SeqStatus.FINISHED
            self.pool.free(seq.block_ids)
            del self._seqs[seq.request_id]
            return SeqOutput(
                seq.request_id, (), True, "stop", seq.num_prompt, seq.num_cached_tokens, 0
            )
        position = req.first_position + len(seq.output)
        stop = False
        if req.forced:
            token = req.forced[min(position, len(req.forced) - 1)]
            stop = position + 1 >= len(req.forced)
        else:
            token = self._token_source(req.seed, position)
        seq.append_output(token)
        if token in req.stop_token_ids and len(seq.output) >= req.min_tokens:
            stop = True
        done = stop or len(seq.output) >= req.max_tokens
        if done:
            seq.status = SeqStatus.FINISHED
            if req.hold:
                self._held[seq.request_id] = seq.block_ids  # until the decode side pulls them
            else:
                self.pool.free(seq.block_ids)
            del self._seqs[seq.request_id]
        return SeqOutput(
            seq.request_id,
            (token,),
            done,
            ("stop" if stop else "length") if done else None,
            seq.num_prompt,
            seq.num_cached_tokens,
            len(seq.output),
            seq.num_host_tokens,
        )

    def _commit(self, seq: Sequence) -> None:
        """Register the blocks ``seq`` filled in the prefix cache (queues ``BlockStored``)."""
        full = seq.num_computed // self._bs
        start = seq.num_committed
        if full <= start or not self._caching:
            return
        hashes = seq.hashes_upto(self._bs, full, self._branch)
        bs = self._bs
        self.pool.commit(
            seq.block_ids[start:full],
            hashes[start:full],
            seq.tokens[start * bs : full * bs],
            hashes[start - 1] if start else None,
            seq.req.lora_name,
        )
        seq.num_committed = full

    def _finish_rejected(self) -> list[SeqOutput]:
        outputs: list[SeqOutput] = []
        for seq in self._rejected:
            seq.status = SeqStatus.FINISHED
            del self._seqs[seq.request_id]
            outputs.append(SeqOutput(seq.request_id, (), True, "error", seq.num_prompt, 0, 0))
        self._rejected.clear()
        return outputs

    # ------------------------------------------------------------------ stats
    def stats(self) -> SchedulerStats:
        prefill = sum(s.remaining for s in self.waiting)
        prefill += sum(s.remaining - s.load_tokens for s in self.running if s.prefilling)
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting) + len(self._rejected),
            kv_usage=self.pool.usage,
            num_free_blocks=self.pool.num_free,
            active_decode_blocks=self.pool.num_used,
            active_prefill_tokens=prefill,
            num_preempted_total=self._preempted_total,
            prompt_tokens_total=self._prompt_total,
            cached_tokens_total=self._cached_total,
            num_transferring=sum(1 for s in self.running if s.transfer_left > 0),
            num_held_blocks=sum(len(b) for b in self._held.values()),
            host_cached_tokens_total=self._host_total,
            num_host_blocks=self.pool.num_host_cached,
        )
