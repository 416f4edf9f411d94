"""A fake vLLM for the adapter's tests: ``FakeLLM`` has the ``AsyncLLM`` methods the adapter
calls, and yields objects with the ``RequestOutput`` attributes it reads
(``outputs[0].token_ids``, ``outputs[0].finish_reason``, ``finished``, ``num_cached_tokens``), as
vLLM does with ``RequestOutputKind.DELTA``; each request's outputs are pushed by the test
(``push``). ``FakeBackend`` stands where ``RealVllmBackend`` builds vLLM's objects."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from schemas.requests import SamplingParams
from tests.support.engines import Sink
from tests.support.vllm_wire_mirror import KVEventBatchV3
from tests.support.wait import wait_for
from workers.engine import EngineHooks, EngineRequest
from workers.engines.vllm.backend import StartedLlm
from workers.engines.vllm.config import KvEventsEndpoints, VllmEngineConfig
from workers.engines.vllm.engine import VllmEngine
from workers.engines.vllm.stats import SchedulerStatsCollector

END = object()  # ends a fake stream without a finished output


def request_output(
    tokens: Sequence[int],
    finished: bool = False,
    reason: str | None = None,
    cached: int | None = 0,
    kv_transfer_params: dict[str, Any] | None = None,
    logprobs: list[dict[int, Any]] | None = None,
    prompt_logprobs: list[dict[int, Any] | None] | None = None,
) -> SimpleNamespace:
    completion = SimpleNamespace(token_ids=list(tokens), finish_reason=reason, logprobs=logprobs)
    return SimpleNamespace(
        outputs=[completion],
        finished=finished,
        num_cached_tokens=cached,
        kv_transfer_params=kv_transfer_params,
        prompt_logprobs=prompt_logprobs,
    )


def lp(logprob: float, rank: int) -> SimpleNamespace:
    """vLLM's ``Logprob(logprob, rank, decoded_token)``."""
    return SimpleNamespace(logprob=logprob, rank=rank, decoded_token=None)


class FakeLLM:
    """The ``AsyncLLM`` methods the adapter calls; each request's outputs are pushed by the test."""

    def __init__(self) -> None:
        self.streams: dict[str, asyncio.Queue[Any]] = {}
        self.calls: list[dict[str, Any]] = []
        self.aborted: list[str] = []
        self.reset_results: list[bool | None] = []
        self.slept: list[int] = []
        self.sleep_error: Exception | None = None
        self.woken: list[list[str] | None] = []
        self.rpcs: list[str] = []
        self.resets = 0
        self.log: list[str] = []  # the order of cache and sleep calls
        self.unhealthy: Exception | None = None
        self.loras: dict[int, Any] = {}
        self.shut_down = False
        self.errored = False  # AsyncLLM.errored: its engine core died

    def queue(self, vllm_id: str) -> asyncio.Queue[Any]:
        return self.streams.setdefault(vllm_id, asyncio.Queue())

    def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, lora_request: Any = None
    ) -> AsyncIterator[Any]:
        return self._outputs(prompt, sampling_params, request_id, lora_request)

    def encode(
        self, prompt: Any, pooling_params: Any, request_id: str, lora_request: Any = None
    ) -> AsyncIterator[Any]:
        return self._outputs(prompt, pooling_params, request_id, lora_request)

    async def _outputs(
        self, prompt: Any, params: Any, request_id: str, lora_request: Any
    ) -> AsyncIterator[Any]:
        """What the test pushes for ``request_id`` (an exception is raised, ``END`` ends the
        stream early); the call is recorded when the adapter starts reading, as vLLM starts."""
        self.calls.append(
            {"prompt": prompt, "params": params, "id": request_id, "lora": lora_request}
        )
        q = self.queue(request_id)
        while True:
            item = await q.get()
            if item is END:
                return
            if isinstance(item, Exception):
                raise item
            yield item

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def reset_prefix_cache(self) -> bool | None:
        self.resets += 1
        self.log.append("reset")
        return self.reset_results.pop(0) if self.reset_results else True

    async def sleep(self, level: int) -> None:
        if self.sleep_error is not None:
            raise self.sleep_error
        self.log.append(f"sleep{level}")
        self.slept.append(level)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        self.log.append(f"wake{tags or ''}")
        self.woken.append(tags)

    async def collective_rpc(self, method: str) -> list[Any]:
        self.log.append(method)
        self.rpcs.append(method)
        return [None]

    async def is_sleeping(self) -> bool:
        return bool(self.slept) and len(self.woken) < len(self.slept)

    async def check_health(self) -> None:
        if self.unhealthy is not None:
            raise self.unhealthy

    def get_num_unfinished_requests(self) -> int:
        return len(self.streams)

    async def add_lora(self, lora: Any) -> bool:
        self.loras[lora[2]] = lora
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        return self.loras.pop(lora_id, None) is not None

    async def list_loras(self) -> set[int]:
        return set(self.loras)

    def shutdown(self) -> None:
        self.shut_down = True


@dataclass
class FakeBackend:
    llm: FakeLLM = field(default_factory=FakeLLM)
    stats: SchedulerStatsCollector | None = None
    kv: KvEventsEndpoints | None = None
    version: str = "0.33.0"
    block_size: int | None = None  # what vLLM settled on (None: as configured)
    on_cpu: bool = False

    def start_llm(
        self, config: VllmEngineConfig, kv: KvEventsEndpoints | None, stats: SchedulerStatsCollector
    ) -> StartedLlm:
        self.stats, self.kv = stats, kv
        size = config.block_size if self.block_size is None else self.block_size
        return StartedLlm(self.llm, 1000, size, self.version, self.on_cpu)

    def sampling_params(self, kwargs: dict[str, Any]) -> Any:
        if kwargs["temperature"] < 0:
            raise ValueError("temperature must be non-negative")
        return {**kwargs, "output_kind": "DELTA"}

    def tokens_prompt(self, token_ids: Sequence[int]) -> Any:
        return {"prompt_token_ids": list(token_ids)}

    def pooling_params(self, dimensions: int | None) -> Any:
        return {"task": "embed", "dimensions": dimensions}

    def embeds_prompt(self, data: bytes) -> tuple[Any, int]:
        return {"prompt_embeds": data}, 7  # the real one: torch.load, 7 positions here

    def kv_event_batch_type(self) -> type[Any]:
        return KVEventBatchV3  # vLLM 0.25's struct, mirrored

    def lora_request(self, name: str, lora_id: int, path: str) -> Any:
        return ("lora", name, lora_id, path)


def config(**overrides: Any) -> VllmEngineConfig:
    base: dict[str, Any] = {"model": "m", "kv_events": False, "max_num_seqs": 8}
    return VllmEngineConfig(**(base | overrides))


async def started(
    version: str = "0.33.0", listener: Any = None, **overrides: Any
) -> tuple[VllmEngine, FakeBackend]:
    backend = FakeBackend(version=version)
    engine = VllmEngine(config(**overrides), backend)
    await engine.start(EngineHooks(listener or (lambda events: None)))
    return engine, backend


def request(rid: str = "r1", n_prompt: int = 5, **sampling: Any) -> EngineRequest:
    sp = SamplingParams(**({"max_tokens": 4} | sampling))
    return EngineRequest(rid, tuple(range(1, n_prompt + 1)), sp)


async def submitted(engine: VllmEngine, backend: FakeBackend, req: EngineRequest) -> Sink:
    sink = Sink()
    before = len(backend.llm.calls)
    engine.add_request(req, sink)
    await wait_for(lambda: len(backend.llm.calls) > before, timeout=2.0, interval=0.001)
    return sink


async def push(backend: FakeBackend, item: Any, call: int = -1) -> None:
    await backend.llm.queue(backend.llm.calls[call]["id"]).put(item)
