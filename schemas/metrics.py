"""Metrics: stream ``FLEET_METRICS``.

- ``WorkerLoad`` on fleet.metrics.{model}.{role}.{worker}: a worker's periodic report of its batch
  and cache (every ``load_interval_s``, and before the first token of a prefill it counted).
- ``RequestObservation`` on fleet.obs.{model}: one per finished request, from the frontend that
  served it; the planner sizes pools from these and replay explains routing with them.
- ``HeldRequests`` on fleet.held.{model}.{frontend}: the requests a frontend holds while every
  worker has a queue (``router/hold_queue.py``), by role, every 0.25 s while it holds any and
  once when it holds none again; the planner counts them with the workers' waiting.
"""

from __future__ import annotations

import msgspec

from schemas.requests import RouteDecision


class WorkerLoad(msgspec.Struct, frozen=True, omit_defaults=True):
    worker_id: str
    model: str
    role: str
    ts_s: float  # wall clock of the report
    num_running: int  # sequences in the running batch
    num_waiting: int  # admitted, not yet scheduled (incl. preempted)
    max_num_seqs: int
    kv_usage: float  # fraction of KV blocks in use by running sequences, 0..1
    num_gpu_blocks: int
    active_decode_blocks: int = 0  # blocks held by running sequences
    active_prefill_tokens: int = 0  # prompt tokens still to prefill
    num_preempted_total: int = 0
    prefix_cache_hit_rate: float = 0.0  # cached / total prompt tokens since start
    step_ms: float = 0.0  # last engine step duration (simulated for the mocker)
    status: str = "ready"
    num_cpu_blocks: int = 0  # blocks of its host-memory KV tier (0: none)
    host_kv_usage: float = 0.0  # fraction of those holding cached KV, 0..1
    # engine steps since the worker started: a worker whose count moves is busy, not stuck (a
    # request queued behind others on it is waiting, not stalled)
    steps_total: int = 0
    v: int = 1


class HeldRequests(msgspec.Struct, frozen=True, omit_defaults=True):
    frontend_id: str
    model: str
    ts_s: float  # wall clock
    held: dict[str, int]  # role -> requests held for it
    v: int = 1


class RequestObservation(msgspec.Struct, frozen=True, omit_defaults=True):
    request_id: str
    model: str
    status: str  # "ok" | "error" | "cancelled" | "shed"
    ts_s: float  # wall clock at the end
    worker_id: str = ""
    isl_tokens: int = 0  # prompt tokens as sent
    osl_tokens: int = 0  # generated tokens
    cached_tokens: int = 0  # prompt tokens not recomputed (any tier of the worker's cache)
    host_cached_tokens: int = 0  # of which loaded back from its host-memory tier
    ttft_s: float = 0.0  # accept -> first token at the frontend
    itl_s: float = 0.0  # mean inter-token latency over the stream
    e2e_s: float = 0.0  # accept -> last token
    attempts: int = 1
    finish_reason: str | None = None
    error: str | None = None
    route: RouteDecision | None = None
    frontend_id: str = ""
    # Disaggregation (a model with decode workers): "remote" (prefilled on a prefill worker,
    # KV pulled) or "local" (the decode worker prefilled), and why (router/disagg.py)
    disagg: str = ""
    disagg_reason: str = ""
    prefill_worker_id: str = ""
    prefill_s: float = 0.0  # accept -> the remote prefill's answer
    kv_transfer_ms: float = 0.0  # the decode worker's pull of the prefill's KV
    v: int = 1
