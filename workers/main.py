"""Run one worker process: connect, register, consume, and drain on SIGTERM.

A process runs one worker or, for scale runs, N mocker workers (``replicas``, ``jetfleet worker
--replicas N``): each a whole worker on the wire (``workers.replica``), all of them the same code
as a lone worker, sharing what belongs to the process: the NATS connection, the tokenizer (and
the mocker's vocabulary), the metrics registry and its operations port, tracing, and the cancel
subscription, fence probe and pool pull (``workers.feeds``). Replica ids: ``{worker_id}-{i}``
(a lone worker keeps ``worker_id``).

Start-up: the first replica starts alone (its engine fixes the model card, published once, before
any registration: frontends need the card), then the others, ``start_concurrency`` at a time,
with their progress logged. SIGTERM or SIGINT (during start-up too) stops every replica: they
drain in parallel and the process ends when the last has deregistered. A replica whose engine
dies leaves at once (its requests migrate) and stops the others: the process exits with
``EngineFailedError`` and its supervisor starts it again.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import Any

import structlog
from nats.aio.client import Client as NATS
from prometheus_client import CollectorRegistry

from base.connect import Hook, close_nats, connect_nats
from base.connection_metrics import ConnectionGauges
from base.consumer_metrics import ConsumerPending
from base.ops_http import start_ops_server
from base.ops_presence import advertised_url
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
from workers.feeds import ProcessFeeds
from workers.metrics import WorkerMetricFamilies, WorkerMetrics
from workers.registry import Registry
from workers.replica import Replica
from workers.runtime import WorkerRuntime

log = structlog.get_logger("jetfleet.worker")

START_CONCURRENCY = 32  # replicas starting at once (each a few JetStream API round trips)


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
    vocab: tuple[int, ...] | None = None,
) -> Engine:
    """``vocab``: the mocker's text-safe token ids, when already computed (replicas share it)."""
    if choice.kind == "mocker":
        vocab = vocab or tokenizer.text_safe_token_ids()
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


def replica_ids(worker_id: str, replicas: int) -> list[str]:
    """The worker ids of a process's replicas: ``worker_id`` alone, or ``{worker_id}-{i}``."""
    return [worker_id] if replicas == 1 else [f"{worker_id}-{i}" for i in range(replicas)]


class WorkerProcess:
    """What the replicas of one process share, and the replicas started so far."""

    def __init__(
        self, cfg: WorkerConfig, choice: EngineChoice, local: LocalModel, nc: NATS
    ) -> None:
        self.cfg = cfg
        self.choice = choice
        self.local = local
        self.nc = nc
        self.js = nc.jetstream()
        self.tokenizer = ModelTokenizer(
            local.tokenizer_json, local.chat_template, local.bos_token, local.eos_token
        )
        self.vocab = self.tokenizer.text_safe_token_ids() if choice.kind == "mocker" else None
        self.tracing = Tracing("jetfleet-worker", cfg.worker_id)  # OTLP export if configured
        self.prom = CollectorRegistry()
        self.families = WorkerMetricFamilies(self.prom)
        self.feeds = ProcessFeeds.for_connection(nc, cfg, self.families.dead_letters)
        self.metrics_url = ""
        self.replicas: list[Replica] = []
        self.stopping = asyncio.Event()  # no more replicas start; every one started drains

    def health(self) -> tuple[bool, str]:
        """Ready while NATS is connected and some replica serves."""
        if not self.nc.is_connected:
            return False, "NATS disconnected"
        if self.stopping.is_set():
            return False, "draining"
        if not any(r.serving for r in self.replicas):
            return False, "draining" if self.replicas else "starting"
        return True, ""

    def serve_ops(self) -> None:
        """The operations port (``metrics_port``: -1 any free port, advertised by every
        replica's registration): every replica's metrics, the process's health."""
        cfg = self.cfg
        ops = start_ops_server(max(cfg.metrics_port, 0), self.prom, self.health, cfg.metrics_host)
        self.metrics_url = advertised_url(cfg.metrics_host, ops.server_port)

    async def start_replica(self, worker_id: str) -> Replica:
        """Build and start one replica (consuming; not yet registered)."""
        cfg = replace(self.cfg, worker_id=worker_id)
        engine = build_engine(self.choice, self.tokenizer, self.local, worker_id, self.vocab)
        registry = Registry(cfg, self.js, engine, self.nc)
        registry.metrics_url = self.metrics_url
        metrics = WorkerMetrics(self.families, cfg.model_name, worker_id)
        runtime = WorkerRuntime(
            cfg, engine, self.nc, registry, self.tokenizer, metrics, self.tracing, self.feeds
        )
        await runtime.start()  # starts the engine
        replica = Replica(cfg, engine, registry, runtime)
        self.replicas.append(replica)
        return replica

    def stop(self) -> None:
        self.stopping.set()
        for replica in self.replicas:
            replica.request_stop()

    async def republish_recent(self) -> None:
        """After a NATS reconnect: every replica's check and republish, at once."""
        results = await asyncio.gather(
            *(r.runtime.republish_recent() for r in self.replicas), return_exceptions=True
        )
        for replica, result in zip(self.replicas, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("republish_failed", worker_id=replica.worker_id, error=repr(result))

    def failures(self) -> list[str]:
        return [
            f"{r.worker_id}: {r.runtime.failure}"
            for r in self.replicas
            if r.runtime.failure is not None
        ]


async def _start_all(
    proc: WorkerProcess, ids: list[str], concurrency: int, serving: list[asyncio.Task[None]]
) -> None:
    """Start and register the replicas ``ids`` (the first alone, then ``concurrency`` at a
    time), each serving in a task added to ``serving``, until all are up or the process stops.
    A replica that fails to start fails the start-up (the others starting are cancelled)."""
    began, started = time.monotonic(), 0
    gate = asyncio.Semaphore(concurrency)

    async def one(worker_id: str, first: bool = False) -> None:
        nonlocal started
        async with gate:
            if proc.stopping.is_set():
                return
            replica = await proc.start_replica(worker_id)
            if first:
                await _publish_card(proc, replica)
            await replica.registry.register()
            serving.append(asyncio.create_task(replica.serve(proc.stop), name=worker_id))
            if proc.stopping.is_set():  # a signal while it started
                replica.request_stop()
        started += 1
        log.info("worker_ready", worker_id=worker_id, model=proc.cfg.model_name,
                 role=proc.cfg.role, engine=proc.choice.kind)  # fmt: skip
        if len(ids) > 1 and (started % concurrency == 0 or started == len(ids)):
            log.info("replicas_started", started=started, replicas=len(ids),
                     elapsed_s=round(time.monotonic() - began, 2))  # fmt: skip

    await one(ids[0], first=True)
    async with asyncio.TaskGroup() as group:
        for worker_id in ids[1:]:
            group.create_task(one(worker_id))


async def _until_stopped(proc: WorkerProcess, serving: list[asyncio.Task[None]]) -> None:
    """Until the process stops, or every replica has stopped on its own (``drain`` ops)."""
    stop = asyncio.create_task(proc.stopping.wait())
    pending: set[asyncio.Task[Any]] = {stop, *serving}
    while stop in pending and len(pending) > 1:
        _done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    stop.cancel()


async def _publish_card(proc: WorkerProcess, first: Replica) -> None:
    """The model card as the first replica's engine serves it, once per process."""
    local = proc.local
    limit = first.engine.max_model_len
    if limit is not None and limit < local.context_length:
        local = replace(local, context_length=limit)  # what the engine serves
    await first.registry.publish_model(local)


async def run_worker(
    cfg: WorkerConfig,
    choice: EngineChoice,
    local: LocalModel | None = None,
    replicas: int = 1,
    start_concurrency: int = START_CONCURRENCY,
) -> None:
    if replicas < 1:
        raise ValueError("replicas must be at least 1")
    if replicas > 1 and choice.kind != "mocker":
        raise ValueError("--replicas above 1 runs mocker workers only (--engine mocker)")
    local = local or load_model_dir(cfg.model_dir, cfg.model_name, cfg.block_size)
    if choice.kind == "vllm":  # a machine without vLLM says so now, not after NATS answered
        from workers.engines.vllm.backend import RealVllmBackend

        RealVllmBackend()
    hooks: list[Hook] = []
    nc = await connect_nats(cfg.nats_url, name=f"worker-{cfg.worker_id}", on_reconnect=hooks)
    proc = WorkerProcess(cfg, choice, local, nc)
    await ensure_topology(proc.js, cfg.subjects)
    pool = pool_consumer(cfg.subjects, cfg.model_name, cfg.role)
    requests = cfg.subjects.stream_name("REQUESTS")
    await ensure_consumer(proc.js, requests, pool)
    if cfg.metrics_port:
        proc.serve_ops()
    hooks.append(proc.republish_recent)  # chunks in flight to a server that died
    on_stop_signal(proc.stop)
    serving: list[asyncio.Task[None]] = []
    connections = ConnectionGauges(proc.prom, nc).start()
    backlog = ConsumerPending(proc.prom, proc.js, requests, pool.durable).start()
    try:
        await _start_all(proc, replica_ids(cfg.worker_id, replicas), start_concurrency, serving)
        await _until_stopped(proc, serving)
    finally:
        connections.cancel()
        backlog.cancel()
        proc.stop()
        await asyncio.gather(*serving, return_exceptions=True)  # the drains, in parallel
        await close_nats(nc)
        proc.tracing.shutdown()
        log.info("worker_stopped", worker_id=cfg.worker_id, replicas=len(proc.replicas))
    failures = proc.failures()
    if failures:
        raise EngineFailedError("; ".join(failures))
