"""Settings of the mocker engine (a simulated vLLM-like engine on the CPU).

The names match vLLM's engine arguments where one exists, so a mocker pool can be configured like
the GPU pool it stands in for. Only ``speedup`` is mocker-specific; the pure core (scheduler,
block pool, timing) never reads it: the async engine divides each step's simulated time by it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MockerConfig:
    num_gpu_blocks: int = 16384
    """KV cache size, in blocks."""
    block_size: int = 16
    """Tokens per KV block."""
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

    def __post_init__(self) -> None:
        if self.num_gpu_blocks < 1 or self.block_size < 1 or self.max_num_seqs < 1:
            raise ValueError("num_gpu_blocks, block_size and max_num_seqs must be positive")
        if self.max_num_batched_tokens < 1 or self.speedup <= 0:
            raise ValueError("max_num_batched_tokens and speedup must be positive")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError("watermark must be in [0, 1)")

    @property
    def watermark_blocks(self) -> int:
        """``watermark`` in blocks."""
        return int(self.watermark * self.num_gpu_blocks)
