"""The only module that touches vLLM: builds ``AsyncLLM`` and vLLM's request objects.

``VllmBackend`` is the seam the engine is written against; ``RealVllmBackend`` imports vLLM
(a GPU build, or the CPU build: see docs/engines/vllm.md) when it is constructed, never at module
import, so the rest of jetfleet, and the unit tests with a fake backend, run without vLLM.
What the adapter uses of vLLM is typed in ``protocol.py``: ``AsyncLlm``, and ``VllmObject``
for what it only builds here and hands back.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from workers.engines.vllm import lifeline
from workers.engines.vllm.config import KvEventsEndpoints, VllmEngineConfig, engine_args_kwargs
from workers.engines.vllm.pinning import pin_process
from workers.engines.vllm.platform import cpu_dtype, cpu_environment, read_cpu_flags
from workers.engines.vllm.protocol import AsyncLlm, VllmObject
from workers.engines.vllm.stats import SchedulerStatsCollector, stat_logger_class


class VllmNotInstalledError(RuntimeError):
    """``--engine vllm`` on a machine without the ``vllm`` package."""


@dataclass(frozen=True)
class StartedLlm:
    llm: AsyncLlm  # vllm.v1.engine.async_llm.AsyncLLM (or a test double with the same methods)
    num_gpu_blocks: int  # KV cache size vLLM settled on after profiling memory
    block_size: int  # tokens per block vLLM actually uses (it may override the asked-for size)
    version: str  # vllm.__version__: which release's behaviour to expect (``versions.py``)
    on_cpu: bool = False  # vLLM's CPU build (no sleep mode, eager by default)
    max_model_len: int | None = None  # the context vLLM settled on (model_config)
    max_num_seqs: int | None = None  # the scheduler's limits vLLM settled on
    max_num_batched_tokens: int | None = None


class VllmBackend(Protocol):
    def start_llm(
        self, config: VllmEngineConfig, kv: KvEventsEndpoints | None, stats: SchedulerStatsCollector
    ) -> StartedLlm:
        """Build the engine (loads weights, profiles memory: minutes on a GPU). Called off the
        event loop, in a thread: vLLM's ``AsyncLLM`` starts its asyncio tasks lazily when it is
        built outside a running loop."""

    def sampling_params(self, kwargs: dict[str, Any]) -> VllmObject:
        """``vllm.SamplingParams(**kwargs, output_kind=DELTA)``."""

    def tokens_prompt(self, token_ids: Sequence[int]) -> VllmObject:
        """``vllm.inputs.TokensPrompt(prompt_token_ids=...)``."""

    def pooling_params(self, dimensions: int | None) -> VllmObject:
        """``vllm.pooling_params.PoolingParams(task="embed", dimensions=...)``."""

    def embeds_prompt(self, data: bytes) -> tuple[VllmObject, int]:
        """``vllm.inputs.EmbedsPrompt(prompt_embeds=tensor)`` and the tensor's positions."""

    def lora_request(self, name: str, lora_id: int, path: str) -> VllmObject:
        """``vllm.lora.request.LoRARequest(name, lora_id, path)``."""

    def kv_event_batch_type(self) -> type[Any]:
        """``vllm.distributed.kv_events.KVEventBatch``: the struct this vLLM publishes its KV
        events as, which the worker decodes them with (``kv_events.BatchReader``)."""


class RealVllmBackend:
    def __init__(self) -> None:
        try:
            self._version = str(importlib.import_module("vllm").__version__)
            self._args = importlib.import_module("vllm.engine.arg_utils")
            self._async_llm = importlib.import_module("vllm.v1.engine.async_llm")
            self._config = importlib.import_module("vllm.config")
            self._sampling = importlib.import_module("vllm.sampling_params")
            self._inputs = importlib.import_module("vllm.inputs")
            self._lora = importlib.import_module("vllm.lora.request")
            self._loggers = importlib.import_module("vllm.v1.metrics.loggers")
            self._platforms = importlib.import_module("vllm.platforms")
            self._usage = importlib.import_module("vllm.usage.usage_lib")
            self._kv_events = importlib.import_module("vllm.distributed.kv_events")
        except ImportError as exc:
            raise VllmNotInstalledError(
                "the vllm engine needs vLLM: bash infra/bootstrap.sh vllm sets it up (its CPU "
                f"build where there is no GPU; docs/engines/vllm.md): {exc}"
            ) from exc

    def engine_args(self, config: VllmEngineConfig, kv: KvEventsEndpoints | None) -> Any:
        kwargs = engine_args_kwargs(config, kv, self._on_cpu())
        if self._on_cpu():
            try:
                flags = read_cpu_flags(Path("/proc/cpuinfo").read_text())
            except OSError:
                flags = frozenset()
            kwargs["dtype"] = cpu_dtype(str(kwargs["dtype"]), flags)
        if "kv_events_config" in kwargs:
            kwargs["kv_events_config"] = self._config.KVEventsConfig(**kwargs["kv_events_config"])
        if "kv_transfer_config" in kwargs:
            kwargs["kv_transfer_config"] = self._config.KVTransferConfig(
                **kwargs["kv_transfer_config"]
            )
        return self._args.AsyncEngineArgs(**kwargs)

    def start_llm(
        self, config: VllmEngineConfig, kv: KvEventsEndpoints | None, stats: SchedulerStatsCollector
    ) -> StartedLlm:
        lifeline.mark_owner()  # vLLM's processes end with this one (lifeline.py)
        if self._on_cpu():
            if (pinned := config.pinned_cores) is not None:
                pin_process(pinned)  # before vLLM's processes start
            cores = len(os.sched_getaffinity(0))
            os.environ.update(cpu_environment(config, os.environ, cores))
        logger = stat_logger_class(self._loggers.StatLoggerBase, stats)
        # a serving engine: vLLM's own server's scheduler defaults (Dynamo's vLLM worker does the
        # same), not the library's: on a large GPU (70 GiB and more) 8,192 or 16,384 prompt
        # tokens a step instead of 2,048; on a CPU both are 2,048
        llm = self._async_llm.AsyncLLM.from_engine_args(
            self.engine_args(config, kv),
            usage_context=self._usage.UsageContext.OPENAI_API_SERVER,
            stat_loggers=[logger],
        )
        cache = llm.vllm_config.cache_config
        scheduler = llm.vllm_config.scheduler_config
        return StartedLlm(
            llm,
            int(cache.num_gpu_blocks or 0),
            int(cache.block_size),
            self._version,
            self._on_cpu(),
            int(llm.vllm_config.model_config.max_model_len),
            int(scheduler.max_num_seqs),
            int(scheduler.max_num_batched_tokens),
        )

    def _on_cpu(self) -> bool:
        return bool(self._platforms.current_platform.is_cpu())

    def sampling_params(self, kwargs: dict[str, Any]) -> VllmObject:
        delta = self._sampling.RequestOutputKind.DELTA
        kwargs = dict(kwargs)
        for key, cls in (
            ("structured_outputs", "StructuredOutputsParams"),
            ("guided_decoding", "GuidedDecodingParams"),
        ):
            if isinstance(kwargs.get(key), dict):
                kwargs[key] = getattr(self._sampling, cls)(**kwargs[key])
        return self._sampling.SamplingParams(**kwargs, output_kind=delta)

    def tokens_prompt(self, token_ids: Sequence[int]) -> VllmObject:
        return self._inputs.TokensPrompt(prompt_token_ids=list(token_ids))

    def embeds_prompt(self, data: bytes) -> tuple[VllmObject, int]:
        """``EmbedsPrompt`` of a ``torch.save``'d tensor (loaded as vLLM's server loads it:
        ``weights_only``, on the CPU), and its number of positions."""
        import io

        torch = importlib.import_module("torch")  # vLLM's own dependency: only on this worker
        tensor = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        if tensor.dim() != 2:
            raise ValueError(
                f"prompt_embeds must be 2-D (positions x hidden), got {tensor.dim()}-D"
            )
        return self._inputs.EmbedsPrompt(prompt_embeds=tensor), int(tensor.shape[0])

    def pooling_params(self, dimensions: int | None) -> VllmObject:
        """``vllm.PoolingParams(task="embed", dimensions=...)`` (both fields in every release)."""
        pooling = importlib.import_module("vllm.pooling_params")
        return pooling.PoolingParams(task="embed", dimensions=dimensions)

    def lora_request(self, name: str, lora_id: int, path: str) -> VllmObject:
        return self._lora.LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=path)

    def kv_event_batch_type(self) -> type[Any]:
        return cast(type[Any], self._kv_events.KVEventBatch)
