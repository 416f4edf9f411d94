"""One sequence in the mocker scheduler: its tokens, computed prefix and blocks."""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.hashing import block_hashes, hash_seed


@dataclass(frozen=True, slots=True)
class SeqRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    seed: int  # output tokens are a pure function of (seed, position)
    lora_name: str | None = None


@dataclass(slots=True, eq=False)  # identity: compared in list membership on the hot path
class Sequence:
    req: SeqRequest
    order: int  # admission counter: the newest running sequence is preempted first
    tokens: list[int] = field(default_factory=list)  # prompt + generated
    output: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose KV is in blocks
    block_ids: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)  # chained hashes of committed full blocks
    num_cached_tokens: int = -1  # prompt tokens hit in the prefix cache (first admission)
    hash_seed: int = 0

    @classmethod
    def new(cls, req: SeqRequest, order: int) -> Sequence:
        return cls(req, order, list(req.prompt_token_ids), hash_seed=hash_seed(req.lora_name))

    @property
    def num_prompt(self) -> int:
        return len(self.req.prompt_token_ids)

    @property
    def remaining(self) -> int:
        """Tokens still to compute before the next token can be sampled."""
        return len(self.tokens) - self.num_computed

    @property
    def prefilling(self) -> bool:
        return self.remaining > 1 or not self.output

    def full_block_hashes(self, block_size: int) -> list[int]:
        """Chained hashes of every full block of the current tokens (for a prefix lookup)."""
        return block_hashes(self.tokens, block_size, self.hash_seed)

    def new_full_blocks(self, block_size: int) -> tuple[int, list[int]]:
        """(first block index, hashes) of blocks filled by computed tokens, not yet committed."""
        full = self.num_computed // block_size
        done = len(self.hashes)
        if full <= done:
            return done, []
        parent = self.hashes[-1] if self.hashes else None
        chunk = self.tokens[done * block_size : full * block_size]
        return done, block_hashes(chunk, block_size, self.hash_seed, parent)

    def reset_for_recompute(self) -> None:
        self.num_computed = 0
        self.block_ids = []
        self.hashes = []
