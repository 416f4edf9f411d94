"""What the adapter uses of vLLM, typed: ``AsyncLlm`` is the part of vLLM's V1 ``AsyncLLM`` it
calls, the outputs are the fields it reads. Protocols, not vLLM's classes: the adapter imports
vLLM only in ``backend.py`` (a machine without vLLM runs everything else, and the unit tests
drive the adapter with doubles), and every release the release matrix covers (0.10-0.33) has
these members with these shapes; fields that came or went between releases are read with
``getattr`` where they are used (``kv_transfer_params``, ``prompt_logprobs``).

What the adapter only builds and hands back (sampling and pooling parameters, prompts, LoRA
requests) is opaque to it: ``VllmObject``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any, Protocol, TypeAlias

VllmObject: TypeAlias = object  # built by the backend, passed back to vLLM as is


class Logprob(Protocol):
    logprob: float
    rank: int | None
    decoded_token: str | None


# per generated position: token id -> its Logprob (vLLM's ``SampleLogprobs``), or None
PositionLogprobs: TypeAlias = Mapping[int, Logprob] | None


class CompletionOutput(Protocol):
    token_ids: Sequence[int]
    finish_reason: str | None
    logprobs: Sequence[PositionLogprobs] | None


class RequestOutput(Protocol):
    outputs: Sequence[CompletionOutput]
    finished: bool
    num_cached_tokens: int | None


class PoolingOutput(Protocol):
    data: Any  # a torch tensor on vLLM's side (``tolist``), or a list in a double


class PoolingRequestOutput(Protocol):
    outputs: PoolingOutput
    finished: bool


class AsyncLlm(Protocol):
    @property
    def errored(self) -> bool: ...

    def generate(
        self,
        prompt: VllmObject,
        sampling_params: VllmObject,
        request_id: str,
        *,
        lora_request: VllmObject | None = ...,
        priority: int = ...,
    ) -> AsyncGenerator[RequestOutput, None]: ...

    def encode(
        self,
        prompt: VllmObject,
        pooling_params: VllmObject,
        request_id: str,
        *,
        lora_request: VllmObject | None = ...,
    ) -> AsyncGenerator[PoolingRequestOutput, None]: ...

    async def abort(self, request_id: str) -> None: ...

    async def check_health(self) -> None: ...

    async def is_sleeping(self) -> bool: ...

    async def sleep(self, level: int = ...) -> None: ...

    async def wake_up(self, tags: list[str] | None = ...) -> None: ...

    async def collective_rpc(self, method: str) -> Any: ...

    async def reset_prefix_cache(self) -> Any: ...  # bool from 0.12, None before

    async def add_lora(self, lora_request: VllmObject) -> bool: ...

    async def remove_lora(self, lora_id: int) -> bool: ...

    async def list_loras(self) -> set[int]: ...

    def get_num_unfinished_requests(self) -> int: ...

    def shutdown(self) -> None: ...
