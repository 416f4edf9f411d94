"""Settings of the vLLM engine, and the vLLM engine arguments they become. Pure.

Names follow vLLM's engine arguments (``AsyncEngineArgs``) where one exists. What jetfleet
needs from vLLM is fixed here rather than left to the operator: prefix caching on (routing is
pointless without it), stats on (``load()`` reads them), KV events through the ZMQ publisher with
its replay socket, and ``block_size`` equal to the fleet's (the router hashes prompts in blocks
of the model card's size; vLLM's blocks must be the same).

KV event endpoints: by default vLLM binds its PUB and replay sockets to ``ipc://`` paths in a
directory made for this worker, so several vLLM workers on one host never collide on ports and
nothing listens beyond the host. ``tcp://*:PORT`` endpoints work too (vLLM binds an endpoint that
contains ``*`` or ``::`` or is ``ipc://``/``inproc://``, and *connects* to any other); the
subscriber connects to ``tcp://127.0.0.1:PORT`` then. Data parallelism (vLLM adding the rank to
the port) is not supported: one worker, one engine core.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from workers.engines.vllm.cpu_list import parse_cpu_list


@dataclass(frozen=True)
class KvEventsEndpoints:
    """Where vLLM binds its KV event sockets (``bind_*``) and where we connect (``connect_*``)."""

    bind_publish: str
    bind_replay: str | None
    topic: str

    @property
    def connect_publish(self) -> str:
        return connect_address(self.bind_publish)

    @property
    def connect_replay(self) -> str | None:
        return None if self.bind_replay is None else connect_address(self.bind_replay)

    @classmethod
    def in_directory(cls, directory: Path, topic: str) -> KvEventsEndpoints:
        return cls(f"ipc://{directory}/kv-events", f"ipc://{directory}/kv-replay", topic)


def connect_address(bind: str) -> str:
    """The address a local client connects to for a bind address (``*``/``0.0.0.0`` -> loopback)."""
    for wildcard in ("tcp://*:", "tcp://0.0.0.0:"):
        if bind.startswith(wildcard):
            return "tcp://127.0.0.1:" + bind[len(wildcard) :]
    if bind.startswith("tcp://[::]:"):
        return "tcp://[::1]:" + bind[len("tcp://[::]:") :]
    return bind


@dataclass(frozen=True)
class VllmEngineConfig:
    model: str
    """HF model id or local directory of the weights (usually the worker's model dir)."""
    block_size: int = 16
    """Tokens per KV block: must equal the fleet's block size for this model."""
    tensor_parallel_size: int = 1
    """GPUs the model is sharded over."""
    gpu_memory_utilization: float = 0.9
    """Fraction of GPU memory vLLM may use (weights + activations + KV cache)."""
    max_model_len: int | None = None
    """Context length (None: the model's)."""
    max_num_seqs: int = 256
    """Sequences in the running batch at most (also the worker's admission limit)."""
    max_num_batched_tokens: int | None = None
    """Tokens per engine step at most (None: vLLM's default)."""
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    """vLLM's: ``priority`` schedules by each request's ``priority`` (the Batch API's lines
    after interactive requests); ``fcfs`` ignores it."""
    dtype: str = "auto"
    quantization: str | None = None
    enforce_eager: bool | None = None
    """No CUDA graphs or torch.compile (faster start, slower decode). None: on for vLLM's CPU
    build (compiling takes minutes on a laptop CPU), off on a GPU."""
    enable_sleep_mode: bool = False
    """Allow the ``sleep``/``wake`` control ops (vLLM's CuMem allocator: a GPU only; on the CPU
    build the worker serves without it and ``sleep`` says why it cannot)."""
    enable_lora: bool = False
    max_loras: int = 4
    """Adapters resident on the GPU at once."""
    max_lora_rank: int = 16
    kv_events: bool = True
    """Subscribe to vLLM's KV events (KV-aware routing needs them)."""
    kv_events_endpoint: str = ""
    """PUB bind address; "" = ``ipc://`` in this worker's own temporary directory."""
    kv_replay_endpoint: str = ""
    """Replay ROUTER bind address; "" = next to the default PUB address."""
    kv_events_topic: str = "kv-events"
    kv_replay_buffer_steps: int = 10_000
    """Batches vLLM keeps for replay."""
    kv_replay_timeout_s: float = 1.0
    """Longest wait for a replay answer before the missing events count as lost."""
    kv_reset_retry_s: float = 2.0
    """After lost events: retry resetting vLLM's prefix cache this often until it succeeds."""
    kv_resync_chunk_tokens: int = 65536
    """A resync republishes the cache in batches of about this many tokens (NATS max_payload)."""
    kv_connector: str | None = None
    """KV transfer connector for disaggregation (e.g. "NixlConnector"); None = off."""
    kv_role: Literal["kv_both", "kv_producer", "kv_consumer"] = "kv_both"
    kv_offloading_size: float | None = None
    """GiB of host memory for a second KV tier (vLLM 0.11.2+): blocks evicted from the GPU are
    kept there and loaded back; vLLM announces them as ``medium="CPU"`` events, which the index
    keeps as this worker's host tier."""
    kv_offloading_backend: str | None = None
    """With ``--kv-offloading-size``: ``native`` (vLLM's CPU offloading, its default) or
    ``lmcache``."""
    cpu_kv_cache_gib: int | None = None
    """vLLM's CPU build: whole GiB of host memory for the KV cache (``VLLM_CPU_KVCACHE_SPACE``,
    which vLLM reads as an integer; None: that variable if set, else 1; vLLM's own default is
    most of a NUMA node)."""
    cpu_threads: int | None = None
    """vLLM's CPU build: threads for the model's kernels (``OMP_NUM_THREADS``; None: that
    variable if set, else every core this process may use)."""
    cpu_cores: str | None = None
    """vLLM's CPU build: the cores the worker and its engine processes run on (a Linux CPU list,
    ``0-3,8``; None or ``none``: wherever the OS places them). ``jetfleet up`` gives each of
    its CPU engines cores of its own (``platform.fleet_cpu_sets``)."""
    extra_engine_args: Mapping[str, Any] = field(default_factory=dict)
    """Any other ``AsyncEngineArgs`` field, applied last (``--vllm-arg key=value``)."""

    @property
    def pinned_cores(self) -> frozenset[int] | None:
        """``cpu_cores`` read (None: not pinned)."""
        return None if self.cpu_cores in (None, "none") else parse_cpu_list(str(self.cpu_cores))

    @property
    def tasks(self) -> tuple[str, ...]:
        """What the worker answers: an embedding model (``--vllm-arg runner=pooling``, or the
        older ``task=embed`` / ``convert=embed``) embeds, any other generates; and takes
        ``prompt_embeds`` when started with ``--vllm-arg enable_prompt_embeds=true``."""
        extra = self.extra_engine_args
        pooling = extra.get("runner") == "pooling" or "embed" in (
            extra.get("task"),
            extra.get("convert"),
        )
        if pooling:
            return ("embed",)
        embeds = extra.get("enable_prompt_embeds") in (True, "true", "True", 1)
        return ("generate", "prompt_embeds") if embeds else ("generate",)

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.max_num_seqs < 1 or self.tensor_parallel_size < 1:
            raise ValueError("block_size, max_num_seqs and tensor_parallel_size must be positive")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.cpu_kv_cache_gib is not None and self.cpu_kv_cache_gib <= 0:
            raise ValueError("cpu_kv_cache_gib must be positive")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError("cpu_threads must be at least 1")
        _ = self.pinned_cores  # a bad CPU list: a clear error at start, not in vLLM's process
        if self.kv_replay_endpoint and not self.kv_events_endpoint:
            raise ValueError("kv_replay_endpoint needs kv_events_endpoint")

    def kv_endpoints(self, directory: Path) -> KvEventsEndpoints:
        """The event endpoints, defaulting to ``ipc://`` paths under ``directory``."""
        if not self.kv_events_endpoint:
            return KvEventsEndpoints.in_directory(directory, self.kv_events_topic)
        return KvEventsEndpoints(
            self.kv_events_endpoint, self.kv_replay_endpoint or None, self.kv_events_topic
        )


def engine_args_kwargs(
    cfg: VllmEngineConfig, kv: KvEventsEndpoints | None, on_cpu: bool = False
) -> dict[str, Any]:
    """Keyword arguments of ``AsyncEngineArgs`` (``on_cpu``: vLLM's CPU build).
    ``kv_events_config`` and ``kv_transfer_config`` are plain dicts here; the backend turns them
    into vLLM's classes."""
    args: dict[str, Any] = {
        "model": cfg.model,
        "block_size": cfg.block_size,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "max_num_seqs": cfg.max_num_seqs,
        "dtype": cfg.dtype,
        "enforce_eager": on_cpu if cfg.enforce_eager is None else cfg.enforce_eager,
        "enable_prefix_caching": True,
        "disable_log_stats": False,
        "enable_sleep_mode": cfg.enable_sleep_mode and not on_cpu,  # vLLM refuses it on a CPU
        "scheduling_policy": cfg.scheduling_policy,
    }
    optional = {
        "max_model_len": cfg.max_model_len,
        "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "quantization": cfg.quantization,
        "kv_offloading_size": cfg.kv_offloading_size,
        "kv_offloading_backend": cfg.kv_offloading_backend if cfg.kv_offloading_size else None,
    }
    args |= {k: v for k, v in optional.items() if v is not None}
    if cfg.enable_lora:
        args["enable_lora"] = True
        args["max_loras"] = cfg.max_loras
        args["max_lora_rank"] = cfg.max_lora_rank
    if kv is not None:
        args["kv_events_config"] = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": kv.bind_publish,
            "replay_endpoint": kv.bind_replay,
            "buffer_steps": cfg.kv_replay_buffer_steps,
            "topic": kv.topic,
        }
    if cfg.kv_connector:
        args["kv_transfer_config"] = {"kv_connector": cfg.kv_connector, "kv_role": cfg.kv_role}
    args |= dict(cfg.extra_engine_args)
    return args
