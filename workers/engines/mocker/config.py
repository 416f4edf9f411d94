"""Settings of the mocker engine (a simulated vLLM-like engine on the CPU)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MockerConfig:
    num_gpu_blocks: int = 16384  # KV blocks in the pool
    block_size: int = 16  # tokens per KV block
    max_num_seqs: int = 256  # sequences in the running batch at most
    max_num_batched_tokens: int = 8192  # tokens computed in one step at most (prefill + decode)
    enable_prefix_caching: bool = True  # reuse cached full blocks across requests
    enable_chunked_prefill: bool = True  # split long prompts over several steps
    speedup: float = 1.0  # simulated time is divided by this (the async engine applies it)
    watermark: float = 0.01  # fraction of blocks kept free when admitting new sequences

    def __post_init__(self) -> None:
        if self.num_gpu_blocks < 1 or self.block_size < 1 or self.max_num_seqs < 1:
            raise ValueError("num_gpu_blocks, block_size and max_num_seqs must be positive")
        if self.max_num_batched_tokens < 1 or self.speedup <= 0:
            raise ValueError("max_num_batched_tokens and speedup must be positive")
