"""Scaling: stream ``FLEET_SCALING``.

The planner publishes ``ScalingDecided`` on fleet.scale.{model}.{role}; connectors act on it and
report ``ScalingStatus`` on fleet.scale.status.{model}.{role}.
"""

from __future__ import annotations

import msgspec


class ScalingDecided(msgspec.Struct, frozen=True, omit_defaults=True):
    model: str
    role: str
    decision_id: int  # planner's monotonically increasing counter
    ts_s: float
    current_replicas: int
    desired_replicas: int
    reasons: tuple[str, ...] = ()
    predicted_rps: float = 0.0
    predicted_isl: float = 0.0
    predicted_osl: float = 0.0
    dry_run: bool = False
    v: int = 1


# The name the design uses for the same message.
ScalingDecision = ScalingDecided


class ScalingStatus(msgspec.Struct, frozen=True, omit_defaults=True):
    model: str
    role: str
    decision_id: int
    ts_s: float
    connector: str  # "local" | "kubernetes"
    state: str  # "applying" | "applied" | "failed"
    replicas: int = 0
    detail: str = ""
    v: int = 1
