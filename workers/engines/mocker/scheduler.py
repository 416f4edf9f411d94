"""The mocker's continuous-batching scheduler (vLLM v1-like), a pure core driven by ``step()``.

Each step:
1. **Running sequences first**, oldest first: a decoding sequence computes 1 token; one still
   prefilling (chunked prefill) computes as much of its prompt as the token budget
   (``max_num_batched_tokens``) allows. A sequence that needs a new block and finds none preempts
   the newest running sequence (recompute mode: its blocks are freed — full ones stay cached — and
   it goes back to the front of the waiting queue), or itself if it is the newest.
2. **Waiting sequences** are admitted in order while there are free sequence slots
   (``max_num_seqs``), budget, and blocks above the watermark. At admission the longest cached
   prefix of full blocks is reused (at least one token is always computed, as in vLLM).
3. The step's simulated duration comes from ``timing.step_ms`` (prefill tokens computed, whether
   anyone decoded, KV usage). Every sequence whose tokens are all computed samples one token from
   ``token_source(seed, position)``; it finishes after ``max_tokens`` tokens.

Blocks that fill up are committed to the prefix cache (queuing ``BlockStored``); evictions queue
``BlockRemoved``. The async engine drains them with ``take_events()``. No I/O, no clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from workers.engines.mocker.block_pool import BlockPool
from workers.engines.mocker.config import MockerConfig
from workers.engines.mocker.sequence import SeqRequest, Sequence
from workers.engines.mocker.timing import step_ms

TokenSource = Callable[[int, int], int]

__all__ = ["Scheduler", "SchedulerStats", "SeqOutput", "SeqRequest", "StepResult"]


@dataclass(frozen=True, slots=True)
class SeqOutput:
    request_id: str
    new_token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int


@dataclass(frozen=True, slots=True)
class StepResult:
    simulated_ms: float
    outputs: tuple[SeqOutput, ...] = ()
    num_prefill_tokens: int = 0
    num_decode_seqs: int = 0
    preempted: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    num_running: int
    num_waiting: int
    kv_usage: float
    num_free_blocks: int
    active_decode_blocks: int
    active_prefill_tokens: int
    num_preempted_total: int
    prompt_tokens_total: int
    cached_tokens_total: int


def default_token_source(seed: int, position: int) -> int:
    """ASCII letters a..z, a pure function of (seed, position)."""
    import xxhash

    return 97 + xxhash.xxh3_64_intdigest(position.to_bytes(8, "little"), seed) % 26


class Scheduler:
    def __init__(self, config: MockerConfig, token_source: TokenSource = default_token_source):
        self.cfg = config
        self.bs = config.block_size
        self.pool = BlockPool(
            config.num_gpu_blocks, config.block_size, config.enable_prefix_caching
        )
        self.token_source = token_source
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._order = 0
        self._preempted_total = 0
        self._prompt_total = 0
        self._cached_total = 0
        self._watermark_blocks = int(config.watermark * config.num_gpu_blocks)

    # ------------------------------------------------------------------ requests
    def add_request(self, req: SeqRequest) -> None:
        if req.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        self._order += 1
        self.waiting.append(Sequence.new(req, self._order))

    def abort(self, request_id: str) -> bool:
        for seq in self.running:
            if seq.req.request_id == request_id:
                self.running.remove(seq)
                self.pool.free(seq.block_ids)
                return True
        for seq in self.waiting:
            if seq.req.request_id == request_id:
                self.waiting.remove(seq)
                return True
        return False

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset()

    def take_events(self):  # type: ignore[no-untyped-def]
        return self.pool.take_events()

    def snapshot_events(self):  # type: ignore[no-untyped-def]
        return self.pool.snapshot_events()

    # ------------------------------------------------------------------ one step
    def step(self) -> StepResult:
        if not self.has_work:
            return StepResult(0.0)
        budget = self.cfg.max_num_batched_tokens
        scheduled: list[tuple[Sequence, int]] = []
        preempted: list[str] = []
        for seq in list(self.running):
            if budget <= 0:
                break
            if seq not in self.running:  # preempted by an older sequence this step
                continue
            n = min(seq.remaining, budget) if self.cfg.enable_chunked_prefill else seq.remaining
            if n > budget:
                continue
            if not self._grow(seq, n, preempted):
                continue
            scheduled.append((seq, n))
            budget -= n
        if not preempted:
            budget = self._admit(budget, scheduled)
        return self._advance(scheduled, preempted)

    def _grow(self, seq: Sequence, n: int, preempted: list[str]) -> bool:
        """Make room for ``n`` more computed tokens, preempting the newest sequences if needed."""
        need = -(-(seq.num_computed + n) // self.bs) - len(seq.block_ids)
        while need > 0:
            blocks = self.pool.allocate(need)
            if blocks is not None:
                seq.block_ids.extend(blocks)
                return True
            victim = max(self.running, key=lambda s: s.order)
            self._preempt(victim)
            preempted.append(victim.req.request_id)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.pool.free(seq.block_ids)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        self._preempted_total += 1

    def _admit(self, budget: int, scheduled: list[tuple[Sequence, int]]) -> int:
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            seq = self.waiting[0]
            cached = self.pool.match_prefix(seq.full_block_hashes(self.bs))
            if len(cached) * self.bs >= len(seq.tokens):
                cached = cached[:-1]  # compute at least the last token
            cached_tokens = len(cached) * self.bs
            todo = len(seq.tokens) - cached_tokens
            n = min(todo, budget) if self.cfg.enable_chunked_prefill else todo
            if n > budget:
                break
            need = -(-(cached_tokens + n) // self.bs) - len(cached)
            if self.pool.num_free - need < self._watermark_blocks and self.running:
                break
            self.pool.take(cached)
            blocks = self.pool.allocate(need)
            if blocks is None:
                self.pool.free(cached)
                break
            self.waiting.popleft()
            seq.block_ids = [*cached, *blocks]
            seq.hashes = [h for b in cached if (h := self.pool.block_hash(b)) is not None]
            seq.num_computed = cached_tokens
            if seq.num_cached_tokens < 0:  # first admission (not a recompute after preemption)
                seq.num_cached_tokens = cached_tokens
                self._prompt_total += seq.num_prompt
                self._cached_total += cached_tokens
            self.running.append(seq)
            scheduled.append((seq, n))
            budget -= n
        return budget

    def _advance(self, scheduled: list[tuple[Sequence, int]], preempted: list[str]) -> StepResult:
        prefill_tokens = sum(n for s, n in scheduled if s.prefilling)
        decode_seqs = sum(1 for s, _ in scheduled if not s.prefilling)
        ms = step_ms(prefill_tokens, decode_seqs, self.pool.usage)
        outputs: list[SeqOutput] = []
        for seq, n in scheduled:
            seq.num_computed += n
            self._commit(seq)
            if seq.num_computed < len(seq.tokens):
                continue  # still prefilling (a chunk)
            token = self.token_source(seq.req.seed, len(seq.output))
            seq.tokens.append(token)
            seq.output.append(token)
            done = len(seq.output) >= seq.req.max_tokens
            if done:
                self.running.remove(seq)
                self.pool.free(seq.block_ids)
            outputs.append(
                SeqOutput(
                    seq.req.request_id,
                    (token,),
                    done,
                    "length" if done else None,
                    seq.num_prompt,
                    max(seq.num_cached_tokens, 0),
                    len(seq.output),
                )
            )
        return StepResult(ms, tuple(outputs), prefill_tokens, decode_seqs, tuple(preempted))

    def _commit(self, seq: Sequence) -> None:
        start, hashes = seq.new_full_blocks(self.bs)
        if not hashes:
            return
        parent = seq.hashes[-1] if seq.hashes else None
        blocks = seq.block_ids[start : start + len(hashes)]
        tokens = seq.tokens[start * self.bs : (start + len(hashes)) * self.bs]
        self.pool.commit(blocks, hashes, tokens, parent, seq.req.lora_name)
        seq.hashes.extend(hashes)

    # ------------------------------------------------------------------ stats
    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_usage=self.pool.usage,
            num_free_blocks=self.pool.num_free,
            active_decode_blocks=sum(len(s.block_ids) for s in self.running),
            active_prefill_tokens=sum(s.remaining for s in self.waiting)
            + sum(s.remaining for s in self.running if s.prefilling),
            num_preempted_total=self._preempted_total,
            prompt_tokens_total=self._prompt_total,
            cached_tokens_total=self._cached_total,
        )
