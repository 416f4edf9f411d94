"""Run one worker process: connect, register, consume, and drain on SIGTERM."""

from __future__ import annotations

from dataclasses import dataclass, replace
from socket import gethostname

import structlog
from prometheus_client import CollectorRegistry

from base.connect import Hook, close_nats, connect_nats
from base.ops_http import start_ops_server
from base.signals import on_stop_signal
from base.topology import ensure_consumer, ensure_topology
from base.tracing import Tracing
from model.card import LocalModel, load_model_dir
from model.tokenizer import ModelTokenizer
from schemas.streams import pool_consumer
from workers.config import WorkerConfig
from workers.engine import Engine
from workers.engines.mocker.config import MockerConfig
from workers.engines.mocker.engine import MockerEngine
from workers.engines.vllm.config import VllmEngineConfig
from workers.metrics import WorkerMetricFamilies, WorkerMetrics
from workers.registry import Registry
from workers.runtime import WorkerRuntime

log = structlog.get_logger("jetfleet.worker")


class EngineFailedError(RuntimeError):
    """The worker's engine died; the worker left the fleet (its requests migrated)."""


@dataclass(frozen=True)
class EngineChoice:
    kind: str  # "mocker" | "vllm"
    mocker: MockerConfig
    vllm: VllmEngineConfig | None = None  # from the --vllm-* flags (no vllm import needed)


def build_engine(
    choice: EngineChoice,
    tokenizer: ModelTokenizer,
    local: LocalModel | None = None,
    engine_id: str = "",
) -> Engine:
    if choice.kind == "mocker":
        vocab = tokenizer.text_safe_token_ids()
        cfg = choice.mocker
        if local is not None and not cfg.kv_block_bytes and local.kv_bytes_per_token:
            cfg = replace(cfg, kv_block_bytes=local.kv_bytes_per_token * cfg.block_size)
        hidden = local.hidden_size if local is not None else 0
        return MockerEngine(cfg, vocab, tokenizer.encode, hidden, engine_id)
    if choice.kind == "vllm":
        from workers.engines.vllm.engine import VllmEngine  # vLLM itself: optional extra, GPU

        if choice.vllm is None:
            raise ValueError("--engine vllm needs its settings (EngineChoice.vllm)")
        return VllmEngine(choice.vllm)
    raise ValueError(f"unknown engine {choice.kind!r}")


async def run_worker(
    cfg: WorkerConfig, choice: EngineChoice, local: LocalModel | None = None
) -> None:
    local = local or load_model_dir(cfg.model_dir, cfg.model_name, cfg.block_size)
    tokenizer = ModelTokenizer(
        local.tokenizer_json, local.chat_template, local.bos_token, local.eos_token
    )
    tracing = Tracing("jetfleet-worker", cfg.worker_id)  # OTLP export if configured
    engine = build_engine(choice, tokenizer, local, cfg.worker_id)
    hooks: list[Hook] = []
    nc = await connect_nats(cfg.nats_url, name=f"worker-{cfg.worker_id}", on_reconnect=hooks)
    js = nc.jetstream()
    await ensure_topology(js, cfg.subjects)
    await ensure_consumer(
        js,
        cfg.subjects.stream_name("REQUESTS"),
        pool_consumer(cfg.subjects, cfg.model_name, cfg.role),
    )
    registry = Registry(cfg, js, engine)
    prom = CollectorRegistry()

    def health() -> tuple[bool, str]:
        if not nc.is_connected:
            return False, "NATS disconnected"
        if registry.status != "ready" or registry.stop_requested.is_set():
            return False, "draining"
        return True, ""

    if cfg.metrics_port:  # -1: any free port, advertised in the registration
        ops = start_ops_server(max(cfg.metrics_port, 0), prom, health, cfg.metrics_host)
        host = cfg.metrics_host if cfg.metrics_host not in ("0.0.0.0", "::") else gethostname()
        registry.metrics_url = f"http://{host}:{ops.server_port}"
    runtime = WorkerRuntime(
        cfg,
        engine,
        nc,
        registry,
        tokenizer,
        WorkerMetrics(WorkerMetricFamilies(prom), cfg.model_name, cfg.worker_id),
        tracing,
    )
    await runtime.start()  # starts the engine
    if engine.max_model_len is not None and engine.max_model_len < local.context_length:
        local = replace(local, context_length=engine.max_model_len)  # what the engine serves
    await registry.publish_model(local)  # before the registration: frontends need the card
    hooks.append(runtime.republish_recent)  # chunks in flight to a server that died
    await registry.register()
    on_stop_signal(registry.request_stop)
    log.info(
        "worker_ready",
        worker_id=cfg.worker_id,
        model=cfg.model_name,
        role=cfg.role,
        engine=choice.kind,
    )
    try:
        await registry.stop_requested.wait()
    finally:
        await runtime.drain_and_stop()  # after an engine failure: deregistered at its start
        log.info("worker_drained", worker_id=cfg.worker_id)
        await registry.deregister()
        await close_nats(nc)
        tracing.shutdown()
        log.info("worker_stopped", worker_id=cfg.worker_id)
    if runtime.failure is not None:
        raise EngineFailedError(runtime.failure)
