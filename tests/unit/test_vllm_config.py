"""vLLM engine settings -> engine arguments, our sampling -> vLLM's, the stat logger; checked
against vLLM's real classes when vLLM is installed."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from schemas.requests import SamplingParams
from workers.engine import EngineRequest
from workers.engines.vllm.config import (
    KvEventsEndpoints,
    VllmEngineConfig,
    connect_address,
    engine_args_kwargs,
)
from workers.engines.vllm.mapping import finish_reason, sampling_kwargs
from workers.engines.vllm.stats import SchedulerStatsCollector, stat_logger_class

FULL_REQUEST = EngineRequest(
    "r",
    (1, 2, 3),
    SamplingParams(
        max_tokens=9,
        temperature=0.3,
        top_p=0.8,
        seed=11,
        ignore_eos=True,
        min_tokens=2,
        stop_token_ids=(7, 8),
        top_k=40,
        min_p=0.05,
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        repetition_penalty=1.1,
    ),
    kv_transfer_params={"remote_engine_id": "e1", "remote_block_ids": [1, 2]},
)


def test_engine_args_defaults_fix_what_the_fleet_needs(tmp_path: Path) -> None:
    cfg = VllmEngineConfig(model="/models/llama", block_size=32)
    kv = cfg.kv_endpoints(tmp_path)
    args = engine_args_kwargs(cfg, kv)
    assert args["model"] == "/models/llama" and args["block_size"] == 32
    assert args["enable_prefix_caching"] is True and args["disable_log_stats"] is False
    assert args["kv_events_config"] == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"ipc://{tmp_path}/kv-events",
        "replay_endpoint": f"ipc://{tmp_path}/kv-replay",
        "buffer_steps": 10_000,
        "topic": "kv-events",
    }
    for absent in ("max_model_len", "quantization", "enable_lora", "kv_transfer_config"):
        assert absent not in args
    assert "kv_events_config" not in engine_args_kwargs(cfg, None)


def test_engine_args_options_and_overrides() -> None:
    cfg = VllmEngineConfig(
        model="m",
        tensor_parallel_size=2,
        gpu_memory_utilization=0.8,
        max_model_len=4096,
        max_num_batched_tokens=2048,
        enable_lora=True,
        max_loras=2,
        kv_connector="NixlConnector",
        extra_engine_args={"swap_space": 8, "max_model_len": 8192},
    )
    args = engine_args_kwargs(cfg, None)
    assert args["tensor_parallel_size"] == 2 and args["gpu_memory_utilization"] == 0.8
    assert args["max_num_batched_tokens"] == 2048
    assert (args["enable_lora"], args["max_loras"], args["max_lora_rank"]) == (True, 2, 16)
    assert args["kv_transfer_config"] == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    assert args["swap_space"] == 8 and args["max_model_len"] == 8192  # extra args win
    assert "kv_offloading_size" not in args and "kv_offloading_backend" not in args
    tiered = engine_args_kwargs(
        VllmEngineConfig(model="m", kv_offloading_size=16.0, kv_offloading_backend="lmcache"), None
    )
    assert (tiered["kv_offloading_size"], tiered["kv_offloading_backend"]) == (16.0, "lmcache")


def test_explicit_tcp_endpoints(tmp_path: Path) -> None:
    cfg = VllmEngineConfig(
        model="m", kv_events_endpoint="tcp://*:5557", kv_replay_endpoint="tcp://*:5558"
    )
    kv = cfg.kv_endpoints(tmp_path)
    assert kv == KvEventsEndpoints("tcp://*:5557", "tcp://*:5558", "kv-events")
    assert (kv.connect_publish, kv.connect_replay) == (
        "tcp://127.0.0.1:5557",
        "tcp://127.0.0.1:5558",
    )
    no_replay = VllmEngineConfig(model="m", kv_events_endpoint="tcp://*:5557").kv_endpoints(
        tmp_path
    )
    assert no_replay.bind_replay is None and no_replay.connect_replay is None


@pytest.mark.parametrize(
    ("bind", "connect"),
    [
        ("tcp://*:5557", "tcp://127.0.0.1:5557"),
        ("tcp://0.0.0.0:5557", "tcp://127.0.0.1:5557"),
        ("tcp://[::]:5557", "tcp://[::1]:5557"),
        ("ipc:///tmp/x/kv", "ipc:///tmp/x/kv"),
        ("tcp://10.0.0.5:5557", "tcp://10.0.0.5:5557"),
    ],
)
def test_connect_address(bind: str, connect: str) -> None:
    assert connect_address(bind) == connect


@pytest.mark.parametrize(
    "bad",
    [
        {"block_size": 0},
        {"gpu_memory_utilization": 0.0},
        {"gpu_memory_utilization": 1.5},
        {"kv_replay_endpoint": "tcp://*:5558"},
    ],
)
def test_vllm_config_refuses_bad_values(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        VllmEngineConfig(model="m", **bad)


def test_sampling_kwargs_carry_every_field_we_have() -> None:
    assert sampling_kwargs(FULL_REQUEST) == {
        "n": 1,
        "max_tokens": 9,
        "temperature": 0.3,
        "top_p": 0.8,
        "top_k": 40,
        "min_p": 0.05,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.25,
        "repetition_penalty": 1.1,
        "seed": 11,
        "ignore_eos": True,
        "min_tokens": 2,
        "stop_token_ids": [7, 8],
        "detokenize": False,
        "extra_args": {
            "kv_transfer_params": {"remote_engine_id": "e1", "remote_block_ids": [1, 2]}
        },
    }
    plain = sampling_kwargs(EngineRequest("r", (1,), SamplingParams(max_tokens=1)))
    assert "extra_args" not in plain and plain["seed"] is None
    assert plain["top_k"] == -1  # off, in the spelling every vLLM version accepts
    assert (plain["min_p"], plain["repetition_penalty"]) == (0.0, 1.0)


@pytest.mark.parametrize(
    ("raw", "ours"),
    [
        ("stop", "stop"),
        ("LENGTH", "length"),
        ("abort", "abort"),
        ("error", "error"),
        (None, "stop"),
    ],
)
def test_finish_reason(raw: str | None, ours: str) -> None:
    assert finish_reason(raw) == ours


class FakeStatLoggerBase(ABC):
    """Shape of vLLM's ``StatLoggerBase`` (abstract ``__init__``, ``record``,
    ``log_engine_initialized``)."""

    @abstractmethod
    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None: ...

    @abstractmethod
    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None: ...

    @abstractmethod
    def log_engine_initialized(self) -> None: ...


def test_stat_logger_feeds_the_collector_with_any_record_signature() -> None:
    collector = SchedulerStatsCollector()
    factory = stat_logger_class(FakeStatLoggerBase, collector)
    logger = factory(SimpleNamespace(), 0)  # vLLM calls factory(vllm_config, engine_index)
    stats = SimpleNamespace(num_running_reqs=4, num_waiting_reqs=2, kv_cache_usage=0.5)
    logger.record(stats, SimpleNamespace(num_preempted_reqs=1))  # vLLM 0.10
    logger.record(stats, None, None, engine_idx=0)  # later: mm_cache_stats, engine_idx
    snap = collector.snapshot()
    assert (snap.num_running, snap.num_waiting, snap.kv_usage) == (4, 2, 0.5)
    assert snap.num_preempted_total == 1 and snap.records == 2
    logger.log_engine_initialized()


# ------------------------------------------------------------ against vLLM (when installed)
def test_sampling_params_build_in_vllm() -> None:
    pytest.importorskip("vllm")
    from vllm.sampling_params import RequestOutputKind

    from workers.engines.vllm.backend import RealVllmBackend

    sp = RealVllmBackend().sampling_params(sampling_kwargs(FULL_REQUEST))
    assert sp.output_kind == RequestOutputKind.DELTA
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.seed) == (9, 0.3, 0.8, 11)
    assert (sp.ignore_eos, sp.min_tokens, list(sp.stop_token_ids)) == (True, 2, [7, 8])
    assert sp.detokenize is False
    assert sp.extra_args["kv_transfer_params"]["remote_engine_id"] == "e1"


def test_engine_args_build_in_vllm(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from workers.engines.vllm.backend import RealVllmBackend

    cfg = VllmEngineConfig(model="facebook/opt-125m", kv_connector="NixlConnector")
    args = RealVllmBackend().engine_args(cfg, cfg.kv_endpoints(tmp_path))
    assert args.kv_events_config.endpoint == f"ipc://{tmp_path}/kv-events"
    assert args.kv_events_config.enable_kv_cache_events is True
    assert args.kv_transfer_config.kv_connector == "NixlConnector"
    assert args.enable_prefix_caching is True and args.block_size == 16


def test_prompt_embeds_load_in_vllm() -> None:
    """With vLLM (and so torch) installed: the tensor torch saved becomes an ``EmbedsPrompt``."""
    pytest.importorskip("vllm")
    from workers.engines.vllm.backend import RealVllmBackend

    raw = (Path(__file__).resolve().parents[1] / "data" / "prompt_embeds_f32_3x64.pt").read_bytes()
    prompt, positions = RealVllmBackend().embeds_prompt(raw)
    assert positions == 3 and tuple(prompt["prompt_embeds"].shape) == (3, 64)
