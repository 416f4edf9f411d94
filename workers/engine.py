"""The one small async interface every engine implements (mocker on CPU, vLLM on GPU).

The worker runtime hands an engine a request and an ``OutputSink``; the engine calls
``sink.on_output`` from its own loop as tokens appear (no task or queue per token, which matters
at tens of thousands of tokens per second). KV cache events are pushed to the listener given at
start. Load stats are read on demand.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from schemas.kv_events import KvCacheEvent
from schemas.requests import SamplingParams


@dataclass(frozen=True, slots=True)
class EngineRequest:
    request_id: str
    token_ids: tuple[int, ...]
    sampling: SamplingParams
    lora_name: str | None = None
    kv_transfer_params: dict[str, object] | None = None


@dataclass(frozen=True, slots=True)
class EngineOutput:
    request_id: str
    new_token_ids: tuple[int, ...]
    finished: bool = False
    finish_reason: str | None = None  # "length" | "stop" | "abort" | "error"
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    error: str | None = None


@dataclass(frozen=True, slots=True)
class EngineLoad:
    num_running: int
    num_waiting: int
    max_num_seqs: int
    kv_usage: float  # 0..1
    num_gpu_blocks: int
    block_size: int
    active_decode_blocks: int = 0
    active_prefill_tokens: int = 0
    num_preempted_total: int = 0
    prompt_tokens_total: int = 0
    cached_tokens_total: int = 0
    step_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class ControlResult:
    ok: bool
    detail: str = ""
    data: dict[str, object] = field(default_factory=dict)


class OutputSink(Protocol):
    def on_output(self, output: EngineOutput) -> None: ...


KvListener = Callable[[Sequence[KvCacheEvent]], None]


class Engine(Protocol):
    name: str
    max_num_seqs: int
    num_gpu_blocks: int
    block_size: int

    async def start(self, kv_listener: KvListener) -> None: ...

    async def stop(self) -> None: ...

    def add_request(self, request: EngineRequest, sink: OutputSink) -> None:
        """Admit a request; outputs (and finally one with ``finished=True``) go to ``sink``."""

    def abort(self, request_id: str) -> bool:
        """Stop a request and free its blocks; the sink gets a final ``abort`` output."""

    def load(self) -> EngineLoad: ...

    async def control(self, op: str, args: dict[str, str]) -> ControlResult:
        """health, sleep, wake, clear_kv, lora_load, lora_unload, lora_list."""
