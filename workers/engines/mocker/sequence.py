"""One sequence in the mocker scheduler: its tokens, computed prefix, blocks and block hashes.

``tokens`` is the prompt followed by the generated tokens. ``num_computed`` of them have their KV
in ``block_ids``; the first ``num_committed`` blocks are in the prefix cache (hashed).
``hashes`` caches the chained hashes of the full blocks of ``tokens``: tokens are only ever
appended, so the hashes stay valid across preemption and are computed once per block, in
batches (``schemas.hashing.block_hashes``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from schemas.hashing import block_hashes, hash_seed


@dataclass(frozen=True, slots=True)
class SeqRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int  # output tokens to generate (the mock stops early only after ``forced``)
    seed: int  # output tokens are a pure function of (seed, position)
    lora_name: str | None = None  # folded into the block hash seed
    first_position: int = 0  # tokens earlier attempts generated: a migration continues there
    # Structured output: the whole text to generate (token ids); the sequence emits these in
    # order instead of sampling and finishes with "stop" after the last one.
    forced: tuple[int, ...] = ()
    embed: bool = False  # an embedding: the prompt is computed, no token is generated
    # Disaggregation. Decode side: the KV of the first ``remote_prompt`` tokens comes from a
    # prefill worker (a simulated transfer) instead of being computed. Prefill side: ``hold``
    # keeps the blocks after the request finishes, until the decode side has pulled them.
    remote_prompt: int = 0
    hold: bool = False


class SeqStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)  # identity semantics: compared by `is` on the hot path
class Sequence:
    req: SeqRequest
    tokens: list[int]  # prompt + generated
    hash_seed: int
    status: SeqStatus = SeqStatus.WAITING
    output: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose KV is in blocks
    block_ids: list[int] = field(default_factory=list)
    num_committed: int = 0  # leading blocks registered in the prefix cache
    hashes: list[int] = field(default_factory=list)  # chained hashes of full blocks of `tokens`
    num_cached_tokens: int = -1  # prompt tokens hit in the cache at first admission (-1: not yet)
    num_host_tokens: int = 0  # of which loaded back from the host tier
    transfer_left: float = 0.0  # bytes of remote KV still to arrive (> 0: waiting for it)
    transfer_ms: float = 0.0  # simulated time its transfer took
    transferred: bool = False  # the remote KV arrived (a preemption then recomputes locally)
    load_left: float = 0.0  # bytes still to load back from the host tier (> 0: waiting)
    load_tokens: int = 0  # prompt tokens that load brings (computed when it lands)

    @classmethod
    def new(cls, req: SeqRequest) -> Sequence:
        return cls(req, list(req.prompt_token_ids), hash_seed(req.lora_name))

    @property
    def request_id(self) -> str:
        return self.req.request_id

    @property
    def num_prompt(self) -> int:
        return len(self.req.prompt_token_ids)

    @property
    def remaining(self) -> int:
        """Tokens still to compute before the next token can be sampled."""
        return len(self.tokens) - self.num_computed

    @property
    def prefilling(self) -> bool:
        """Computing more than the last sampled token (a prompt, or a recompute)."""
        return self.remaining > 1 or not self.output

    def blocks_needed(self, block_size: int, new_tokens: int) -> int:
        """Blocks to add so that ``new_tokens`` more tokens fit."""
        total = -(-(self.num_computed + new_tokens) // block_size)
        return max(total - len(self.block_ids), 0)

    def hashes_upto(self, block_size: int, num_blocks: int | None = None) -> list[int]:
        """``hashes``, extended to cover the first ``num_blocks`` full blocks (default: every full
        block of ``tokens``); it may hold more. Only new blocks are hashed."""
        full = len(self.tokens) // block_size if num_blocks is None else num_blocks
        have = len(self.hashes)
        if full > have:
            parent = self.hashes[-1] if self.hashes else None
            chunk = self.tokens[have * block_size : full * block_size]
            self.hashes.extend(block_hashes(chunk, block_size, self.hash_seed, parent))
        return self.hashes

    def append_output(self, token: int) -> None:
        self.tokens.append(token)
        self.output.append(token)

    def reset_for_recompute(self) -> None:
        """Preempted (recompute mode): forget the KV; tokens and hashes are kept."""
        self.status = SeqStatus.WAITING
        self.num_computed = 0
        self.block_ids = []
        self.num_committed = 0
        self.load_left = 0.0  # a load in flight is dropped with the blocks it was filling
        self.load_tokens = 0
