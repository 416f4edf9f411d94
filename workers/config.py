"""Configuration of one worker process."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from schemas import Subjects
from schemas.discovery import WorkerRole
from schemas.hashing import DEFAULT_BRANCH_BLOCKS


def new_worker_id() -> str:
    return f"w-{uuid.uuid4().hex[:10]}"


@dataclass(frozen=True)
class WorkerConfig:
    nats_url: str
    model_dir: Path  # HF-style directory: tokenizer.json, tokenizer_config.json, config.json
    model_name: str  # served model name
    role: WorkerRole = "agg"
    engine: str = "mocker"
    subjects: Subjects = field(default_factory=Subjects)
    worker_id: str = field(default_factory=new_worker_id)
    heartbeat_interval_s: float = 1.0  # registration refresh period
    ttl_s: float = 4.0  # routers drop the worker when its heartbeat is older than this
    load_interval_s: float = 0.25  # WorkerLoad report period (and when a prefill it counted ends)
    load_keepalive_s: float = 1.0
    """A busy worker's unchanged load report is sent again only this often (routers ignore
    reports older than their --kv-load-report-max-age, 5 s by default); an idle worker's is not
    sent again (no fresh report reads as idle)."""
    flush_interval_s: float = 0.005  # longest a token waits before it is published (light load)
    max_flush_interval_s: float = 0.02  # ... under a full batch (see flush_window)
    flush_batch_unit: int = 16  # the window grows by flush_interval_s per this many requests
    kv_flush_interval_s: float = 0.005  # longest a KV event waits to go out with the next ones
    # (one message for a prefill's blocks and the decode blocks after it, not one per engine
    # step: each message costs NATS, the indexer and Redis a round of system calls; routers
    # cover the delay with their own recent routes, the hints)
    ack_wait_s: float = 10.0  # JetStream redelivers a request not touched for this long (a
    # delivery lost in a NATS failover comes again after it; running ones are touched every third)
    drain_timeout_s: float = 60.0  # SIGTERM: longest wait for in-flight requests
    max_pending_requests: int = 1024  # un-acked routed requests the server may push at once
    metrics_port: int = 0  # Prometheus /metrics, /health, /ready; 0 = off, -1 = any free port
    metrics_host: str = "127.0.0.1"  # 0.0.0.0 in a pod, for the kubelet's probes
    block_size: int = 16
    kv_branch_blocks: int = DEFAULT_BRANCH_BLOCKS
    """Leading blocks of a prompt that pick its shard of the prefix index (the branch point of
    ``schemas.hashing``): every worker of a model must use the same."""
    managed_by: str = "hand"  # who started it: a connector ("local", "kubernetes") or "hand"
    pid: int = field(default_factory=os.getpid)

    def flush_window(self, in_flight: int) -> float:
        """Coalescing window for ``in_flight`` requests: the base up to ``flush_batch_unit``,
        then growing with the batch, never past ``max_flush_interval_s``."""
        grown = self.flush_interval_s * in_flight / max(self.flush_batch_unit, 1)
        cap = max(self.max_flush_interval_s, self.flush_interval_s)
        return min(max(self.flush_interval_s, grown), cap)

    def flush_delay(self, in_flight: int, urgent: bool, gap_s: float) -> float:
        """How long a request's new output waits before it is published: 0 when ``urgent`` (a
        first token, an end) or when the request's outputs come ``gap_s`` apart or more than the
        window (its next token would arrive after the window closed: waiting coalesces nothing
        and only delays every token by the window; an engine in real time steps every 6-60 ms),
        else the window."""
        window = self.flush_window(in_flight)
        return 0.0 if urgent or gap_s >= window else window
