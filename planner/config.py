"""Planner settings and the per-interval input of the planner core.

``PlannerConfig`` holds every setting of the planner (one config class per component);
``IntervalObservation`` is what the service (live) or replay (recorded) measured over one
adjustment interval. Both are frozen; ``planner.core.plan`` takes them and returns decisions.

Roles: ``"prefill"`` pools are sized on prefill demand only, ``"decode"`` pools on decode demand
only, and any other role (``"agg"``, aggregated workers doing both) on the larger of the two.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from planner.capacity import DEFAULT_PROFILE, CapacityProfile
from planner.predictors import PREDICTOR_NAMES

Mode = Literal["throughput", "load"]


@dataclass(frozen=True)
class PlannerConfig:
    adjustment_interval_s: float = 30.0
    """Length of one planning interval; request rate = requests in the interval / this."""
    ttft_target_s: float = 0.5
    """Time-to-first-token target (compared with the interval's p90 TTFT)."""
    itl_target_s: float = 0.05
    """Inter-token latency target (compared with the interval's mean ITL)."""
    mode: Mode = "throughput"
    """``throughput``: size pools from predicted load and the capacity model. ``load``: step one
    replica at a time on queueing and KV pressure (faster, needs no profile)."""
    predictor: str = "holt"
    """Predictor for rate, ISL, OSL and cached tokens: constant | moving_average | holt."""
    predictor_params: Mapping[str, float] = field(default_factory=dict)
    """Keyword parameters of the predictor (``window``; ``alpha``, ``beta``)."""
    profile: CapacityProfile = DEFAULT_PROFILE
    """Per-replica capacity (tokens/s) at the targets; refined online by correction factors."""
    default_min_replicas: int = 1
    """Lower bound of every role without an entry in ``min_replicas``."""
    default_max_replicas: int = 8
    """Upper bound of every role without an entry in ``max_replicas``."""
    min_replicas: Mapping[str, int] = field(default_factory=dict)
    """Per-role lower bounds (role -> replicas)."""
    max_replicas: Mapping[str, int] = field(default_factory=dict)
    """Per-role upper bounds (role -> replicas)."""
    max_total_replicas: int = 16
    """GPU budget: replicas over all roles at most."""
    scale_up_cooldown_s: float = 60.0
    """Least time between two scale-ups of a role."""
    scale_down_cooldown_s: float = 300.0
    """Least time between any change of a role (or the planner's start) and a scale-down."""
    scale_down_step: int = 1
    """Most replicas one scale-down decision removes (each one predicted safe)."""
    arrival_estimate: bool = True
    """Throughput mode: estimate the interval's arrivals as finished requests plus the growth of
    requests in the system (running + waiting, from worker reports). Finished requests alone
    stop growing once the pool saturates, exactly when more replicas are needed."""
    backlog_drain_s: float = 0.0
    """Throughput mode: size for the predicted rate plus the waiting requests drained within
    this many seconds (0: one adjustment interval)."""
    scale_down_margin: float = 0.8
    """Scale down only if the predicted load fits in one replica fewer at <= this utilisation."""
    correction_min_utilisation: float = 0.5
    """Feed latency to the online correction only when the pool ran at least this busy (or
    missed its target): an idle pool's latency says nothing about its capacity."""
    load_queue_high: float = 4.0
    """Load mode: scale up when waiting requests per replica exceed this."""
    load_queue_low: float = 0.5
    """Load mode: scale down only when waiting requests per replica are at most this..."""
    load_kv_high: float = 0.85
    """Load mode: scale up when the role's mean KV usage (0..1) exceeds this."""
    load_kv_low: float = 0.4
    """Load mode: ...and its mean KV usage is at most this."""

    def __post_init__(self) -> None:
        if self.adjustment_interval_s <= 0 or self.ttft_target_s <= 0 or self.itl_target_s <= 0:
            raise ValueError("interval and latency targets must be positive")
        if self.predictor not in PREDICTOR_NAMES:
            raise ValueError(f"unknown predictor {self.predictor!r}")
        if not 0.0 < self.scale_down_margin <= 1.0:
            raise ValueError("scale_down_margin must be in (0, 1]")
        if self.load_queue_low > self.load_queue_high or self.load_kv_low > self.load_kv_high:
            raise ValueError("load-mode low thresholds must not exceed high ones")
        if self.max_total_replicas < 0 or self.default_min_replicas < 0:
            raise ValueError("replica bounds must not be negative")
        if self.scale_down_step < 1 or self.backlog_drain_s < 0:
            raise ValueError("scale_down_step must be >= 1 and backlog_drain_s >= 0")

    def min_for(self, role: str) -> int:
        return self.min_replicas.get(role, self.default_min_replicas)

    def max_for(self, role: str) -> int:
        return max(self.max_replicas.get(role, self.default_max_replicas), self.min_for(role))


@dataclass(frozen=True)
class IntervalObservation:
    ts_s: float
    """End of the interval (wall clock, or the recorded clock in replay)."""
    num_requests: int
    """Requests finished in the interval."""
    mean_isl: float = 0.0
    """Mean prompt tokens per request."""
    mean_osl: float = 0.0
    """Mean generated tokens per request."""
    p50_ttft_s: float = 0.0
    p90_ttft_s: float = 0.0
    """TTFT percentiles over the interval's requests (0 = no data)."""
    itl_s: float = 0.0
    """Mean inter-token latency over the interval's requests (0 = no data)."""
    mean_cached_tokens: float = 0.0
    """Mean prompt tokens served from the prefix cache per request."""
    replicas: Mapping[str, int] = field(default_factory=dict)
    """Current replicas per role; the planner plans exactly these roles."""
    unmanaged: Mapping[str, int] = field(default_factory=dict)
    """Of ``replicas``, the workers no connector started (by hand): counted as capacity, never
    relied on, so the workers the connector owns stay at the role's minimum on their own."""
    total_waiting: Mapping[str, int] = field(default_factory=dict)
    """Waiting requests summed over each role's workers at the end of the interval."""
    total_running: Mapping[str, int] = field(default_factory=dict)
    """Running requests summed over each role's workers at the end of the interval."""
    mean_kv_usage: Mapping[str, float] = field(default_factory=dict)
    """Mean KV usage (0..1) over each role's workers at the end of the interval."""


def role_phases(role: str) -> tuple[str, ...]:
    """The phases a role's pool is sized for."""
    if role in ("prefill", "decode"):
        return (role,)
    return ("prefill", "decode")
