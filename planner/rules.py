"""Per-role targets of the two planning modes, before damping and bounds (see
``planner.core``). Pure functions of the settings, the prediction and the measurements.

Throughput mode (``throughput_target``): the predicted demand of each phase the role serves,

- prefill: ``rps * (isl - cached)`` uncached prompt tokens/s,
- decode: ``rps * osl`` output tokens/s,

is divided by one replica's corrected capacity (``profile * correction``) and rounded up; the
role needs the max over its phases. Below the current size the target is the fewest replicas
that serve the demand at ``scale_down_margin`` utilisation, if that is below ``current``, else the
role holds: scale down only when sure (the core then removes at most ``scale_down_step``).

Load mode (``load_target``): one replica up when the role's waiting requests per replica exceed
``load_queue_high`` or its mean KV usage exceeds ``load_kv_high``; one down when waiting per
replica <= ``load_queue_low`` and KV usage <= ``load_kv_low``; else hold. Reacts within one
interval to queueing and cache pressure, without a capacity profile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.capacity import OnlineCorrection
from planner.config import IntervalObservation, PlannerConfig, role_phases

_EPS = 1e-9


@dataclass(frozen=True)
class Prediction:
    """Forecast of the next interval."""

    rps: float  # requests/s
    isl: float  # mean prompt tokens
    osl: float  # mean output tokens
    cached: float  # mean prompt tokens served from the prefix cache

    def demand(self, phase: str) -> float:
        """Tokens/s the fleet must serve in ``phase``."""
        if phase == "prefill":
            return self.rps * max(self.isl - self.cached, 0.0)
        return self.rps * self.osl


def replicas_needed(demand: float, capacity: float, utilisation: float = 1.0) -> int:
    """Replicas of ``capacity`` tokens/s each serving ``demand`` at <= ``utilisation``."""
    if demand <= 0.0:
        return 0
    return max(1, math.ceil(demand / (capacity * utilisation) - _EPS))


def throughput_target(
    cfg: PlannerConfig,
    correction: OnlineCorrection,
    prediction: Prediction,
    role: str,
    current: int,
) -> tuple[int, tuple[str, ...]]:
    """Target replicas of ``role`` from the predicted load, with the reasons."""
    needed: dict[str, int] = {}
    with_margin: dict[str, int] = {}
    for phase in role_phases(role):
        capacity = correction.apply(cfg.profile, phase)
        demand = prediction.demand(phase)
        needed[phase] = replicas_needed(demand, capacity)
        with_margin[phase] = replicas_needed(demand, capacity, cfg.scale_down_margin)
    phase = max(needed, key=lambda p: (needed[p], p))
    required = needed[phase]
    why: tuple[str, ...] = (
        f"predicted {prediction.rps:.1f} rps (isl {prediction.isl:.0f}, osl "
        f"{prediction.osl:.0f}) needs {required} replicas ({phase})",
    )
    if required == 0 and prediction.rps > 0.0:
        # requests arrive but none finished to tell their lengths: turned away with no replica
        # to serve them (scaled to zero). Any demand needs one.
        required = 1
        why = (*why, "requests arrive with no replica to measure them: 1")
    if required > current:
        return required, why
    if required < current:
        safe = max(with_margin.values())
        if safe <= current - 1:
            return safe, (*why, f"fits in {max(safe, 1)} at {cfg.scale_down_margin:.0%}")
        return current, (*why, f"hold: not within {cfg.scale_down_margin:.0%} of {current - 1}")
    return current, why


def load_target(
    cfg: PlannerConfig, obs: IntervalObservation, role: str, current: int
) -> tuple[int, tuple[str, ...]]:
    """Target replicas of ``role`` from queueing and KV pressure, with the reasons."""
    waiting = obs.total_waiting.get(role, 0) / max(current, 1)
    kv = obs.mean_kv_usage.get(role, 0.0)
    state = f"waiting {waiting:.1f}/replica, kv {kv:.0%}"
    if waiting > cfg.load_queue_high or kv > cfg.load_kv_high:
        return current + 1, (f"{state}: above threshold",)
    if current == 0 and obs.num_requests > 0:  # scaled to zero and requests turned away
        return 1, (f"{obs.num_requests} requests with no replica",)
    if waiting <= cfg.load_queue_low and kv <= cfg.load_kv_low and current > 0:
        return current - 1, (f"{state}: well below thresholds",)
    return current, (f"{state}: within thresholds",)
