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
    mode: str = ""  # planner mode: "throughput" | "load"
    unmanaged_replicas: int = 0  # of current_replicas: workers no connector started (by hand)
    # What the decision was made from, so replay reproduces it exactly: the FLEET_METRICS
    # messages of the model with after_seq < stream seq <= last_seq, the planner state
    # (msgpack of planner.core.PlannerState) before the interval and the settings. Every role
    # of one interval carries the same values.
    metrics_after_seq: int = 0
    metrics_last_seq: int = 0
    planner_state: bytes = b""
    planner_config: bytes = b""  # msgpack of planner.config.PlannerConfig (the live settings)
    v: int = 1

    @property
    def changed(self) -> bool:
        """False for a hold (recorded so replay and operators see every interval)."""
        return self.desired_replicas != self.current_replicas


# The name the design uses for the same message.
ScalingDecision = ScalingDecided


class ScalingStatus(msgspec.Struct, frozen=True, omit_defaults=True):
    model: str
    role: str
    decision_id: int
    ts_s: float
    connector: str  # "local" | "kubernetes"
    state: str  # "applying" | "applied" | "failed" | "skipped"
    replicas: int = 0
    detail: str = ""
    v: int = 1
