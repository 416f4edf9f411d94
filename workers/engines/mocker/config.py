"""Settings of the mocker engine (a simulated vLLM-like engine on the CPU).

The names match vLLM's engine arguments where one exists, so a mocker pool can be configured like
the GPU pool it stands in for. Only ``speedup`` is mocker-specific; the pure core (scheduler,
block pool, timing) never reads it: the async engine divides each step's simulated time by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from schemas.hashing import DEFAULT_BRANCH_BLOCKS


@dataclass(frozen=True)
class MockerConfig:
    num_gpu_blocks: int = 16384
    """KV cache size, in blocks."""
    block_size: int = 16
    """Tokens per KV block."""
    kv_branch_blocks: int = DEFAULT_BRANCH_BLOCKS
    """The branch point of its block hashes (``schemas.hashing``)."""
    max_num_seqs: int = 256
    """Sequences in the running batch at most."""
    max_num_batched_tokens: int = 8192
    """Tokens computed in one engine step at most (prefill chunks + 1 per decoding sequence)."""
    enable_prefix_caching: bool = True
    """Reuse cached full blocks of earlier sequences (chained block hashes)."""
    enable_chunked_prefill: bool = True
    """Split a prompt longer than the step's token budget over several steps."""
    speedup: float = 1.0
    """Divisor of simulated time (1.0 = real time); applied by the async engine, not the core."""
    watermark: float = 0.01
    """Fraction of all blocks (0..1) kept free when admitting a sequence while others run."""
    kv_transfer_bandwidth: float = 64.0
    """GB/s of a decode worker's link for KV pulled from prefill workers (shared fairly by the
    transfers in flight into it)."""
    kv_transfer_mode: Literal["full_prompt", "destination_missing"] = "destination_missing"
    """Which prompt blocks a remote prefill moves: all, or only those this worker lacks."""
    kv_block_bytes: int = 0
    """Bytes of one KV block (0: from the model's config.json, layers x 2 x KV heads x head dim x
    dtype bytes x block size; 2 MiB per 16 tokens when it does not say)."""
    num_cpu_blocks: int = 0
    """Host-memory KV tier, in blocks (0: none). Blocks evicted from the GPU are copied there
    (least recently used out first); a prompt whose prefix is there loads it back instead of
    recomputing it."""
    kv_offload_bandwidth: float = 25.0
    """GB/s of the host-to-GPU copy that loads blocks back from the host tier (PCIe 4.0 x16 in
    practice)."""
    kv_hold_timeout_s: float = 30.0
    """A prefill worker frees the blocks of a finished remote-decode request after this long
    (simulated seconds: divided by ``speedup``) if nobody said the KV was pulled or dropped."""

    def __post_init__(self) -> None:
        if self.num_gpu_blocks < 1 or self.block_size < 1 or self.max_num_seqs < 1:
            raise ValueError("num_gpu_blocks, block_size and max_num_seqs must be positive")
        if self.max_num_batched_tokens < 1 or self.speedup <= 0:
            raise ValueError("max_num_batched_tokens and speedup must be positive")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError("watermark must be in [0, 1)")
        if self.kv_transfer_bandwidth <= 0 or self.kv_block_bytes < 0:
            raise ValueError("kv_transfer_bandwidth must be positive, kv_block_bytes >= 0")
        if self.num_cpu_blocks < 0 or self.kv_offload_bandwidth <= 0:
            raise ValueError("num_cpu_blocks must be >= 0 and kv_offload_bandwidth positive")
        if self.kv_transfer_mode not in ("full_prompt", "destination_missing"):
            raise ValueError("kv_transfer_mode must be full_prompt or destination_missing")

    @property
    def block_bytes(self) -> int:
        return self.kv_block_bytes or (2 << 20) * self.block_size // 16

    @property
    def watermark_blocks(self) -> int:
        """``watermark`` in blocks."""
        return int(self.watermark * self.num_gpu_blocks)
