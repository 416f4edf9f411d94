"""The planner core: a pure function from (settings, state, one interval's measurements) to
scaling decisions. No I/O, no clock: the same inputs always give the same decisions, so the core
runs unchanged live (``planner`` service) and in replay over recorded streams.

Each call to ``plan(cfg, state, obs)``:

1. **Correct the capacity model.** For each phase (prefill: p90 TTFT vs ``ttft_target_s``;
   decode: mean ITL vs ``itl_target_s``) the interval's latency updates the phase's
   ``OnlineCorrection`` factor, but only if the pools serving it ran at >=
   ``correction_min_utilisation`` of their corrected capacity or missed the target.
2. **Predict** the next interval's request rate, mean ISL, OSL and cached tokens with
   ``cfg.predictor``. The rate fed in is the interval's *arrivals* / ``adjustment_interval_s``:
   finished requests plus the growth of requests running or waiting on the workers
   (``arrival_estimate``; finished requests alone flatten at the pool's throughput exactly when
   it saturates). An interval without requests leaves the length predictors alone.
3. **Target per role** (``planner.rules``). Throughput mode: ``ceil(demand / (capacity *
   correction))`` per phase, the max over the role's phases, where the rate is the prediction
   plus the role's waiting requests drained within ``backlog_drain_s`` (default one interval);
   a decrease is proposed only if the demand fits in fewer replicas at ``scale_down_margin``
   utilisation. Load mode: one replica
   up when waiting per replica > ``load_queue_high`` or KV usage > ``load_kv_high``; one down when
   both are at most ``load_queue_low`` / ``load_kv_low``.
4. **Damp.** Up: at once to the target unless the role scaled up less than
   ``scale_up_cooldown_s`` ago. Down: at most ``scale_down_step`` (default 1) replicas per
   decision, only if ``scale_down_cooldown_s`` passed since the role's last change (or the
   planner's first interval) and the role did not scale up in the previous interval.
5. **Bound.** Clamp to the role's [min, max] (bounds override cooldowns), then cut to the GPU
   budget ``max_total_replicas``: take replicas away from the largest increase first, then from
   the largest role, never below a role's minimum. Workers started by hand
   (``obs.unmanaged``) count as capacity but not towards the minimum: they may leave at any
   time, so a role's floor is its minimum plus them, and the workers a connector owns never go
   below the minimum because someone else started one.

``plan`` returns one ``Decision`` per role in ``obs.replicas`` (sorted by role), holds included
(``desired == current``) so replay can say why nothing happened; publish those with ``changed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TypeVar

from planner.capacity import PHASES, OnlineCorrection
from planner.config import IntervalObservation, Mode, PlannerConfig, role_phases
from planner.predictors import make_predictor
from planner.rules import Prediction, load_target, throughput_target
from schemas.scaling import ScalingDecided

__all__ = [
    "Decision",
    "IntervalObservation",
    "Mode",
    "PlannerConfig",
    "PlannerState",
    "plan",
]

SERIES: tuple[str, ...] = ("rps", "isl", "osl", "cached")
T = TypeVar("T", int, float)


@dataclass(frozen=True)
class PlannerState:
    """Everything the planner remembers between intervals, as plain immutable values."""

    interval_index: int = 0
    """Intervals planned so far."""
    decision_counter: int = 0
    """Id of the last decision returned (ids increase by one per decision)."""
    start_ts_s: float | None = None
    """``ts_s`` of the first interval; counts as a change for the scale-down cooldown."""
    last_scale_up_ts: tuple[tuple[str, float], ...] = ()
    """(role, ts_s) of each role's last scale-up."""
    last_change_ts: tuple[tuple[str, float], ...] = ()
    """(role, ts_s) of each role's last change, up or down."""
    last_scale_up_interval: tuple[tuple[str, int], ...] = ()
    """(role, interval_index) of each role's last scale-up."""
    predictors: tuple[tuple[float, ...], ...] = ((), (), (), ())
    """Predictor snapshots for rate, ISL, OSL, cached tokens (``SERIES`` order)."""
    correction: OnlineCorrection = field(default_factory=OnlineCorrection)
    """Online capacity correction per phase."""
    in_system: int = -1
    """Requests running or waiting on the workers at the end of the last interval (-1: no
    worker reports yet)."""


@dataclass(frozen=True)
class Decision:
    role: str
    current: int
    desired: int
    reasons: tuple[str, ...]
    predicted_rps: float
    predicted_isl: float
    predicted_osl: float
    decision_id: int
    ts_s: float
    unmanaged: int = 0
    """Of ``current``, the workers no connector started."""

    @property
    def changed(self) -> bool:
        return self.desired != self.current

    def to_wire(self, model: str, dry_run: bool = False) -> ScalingDecided:
        return ScalingDecided(
            model=model,
            role=self.role,
            decision_id=self.decision_id,
            ts_s=self.ts_s,
            current_replicas=self.current,
            desired_replicas=self.desired,
            reasons=self.reasons,
            predicted_rps=self.predicted_rps,
            predicted_isl=self.predicted_isl,
            predicted_osl=self.predicted_osl,
            dry_run=dry_run,
            unmanaged_replicas=self.unmanaged,
        )


def _set(pairs: tuple[tuple[str, T], ...], role: str, value: T) -> tuple[tuple[str, T], ...]:
    return tuple(sorted({**dict(pairs), role: value}.items()))


def _correct(
    cfg: PlannerConfig, corr: OnlineCorrection, obs: IntervalObservation
) -> OnlineCorrection:
    if obs.num_requests <= 0:
        return corr
    rps = obs.num_requests / cfg.adjustment_interval_s
    demand = {
        "prefill": rps * max(obs.mean_isl - obs.mean_cached_tokens, 0.0),
        "decode": rps * obs.mean_osl,
    }
    observed = {"prefill": obs.p90_ttft_s, "decode": obs.itl_s}
    target = {"prefill": cfg.ttft_target_s, "decode": cfg.itl_target_s}
    for phase in PHASES:
        replicas = sum(n for r, n in obs.replicas.items() if phase in role_phases(r))
        if replicas <= 0 or observed[phase] <= 0.0:
            continue
        utilisation = demand[phase] / (replicas * corr.apply(cfg.profile, phase))
        if utilisation >= cfg.correction_min_utilisation or observed[phase] > target[phase]:
            corr = corr.update(phase, observed[phase], target[phase])
    return corr


def in_system(obs: IntervalObservation) -> int:
    """Requests on the workers at the end of ``obs`` (-1 when no worker reported)."""
    if not obs.total_running and not obs.total_waiting:
        return -1
    return sum(obs.total_running.values()) + sum(obs.total_waiting.values())


def arrivals(cfg: PlannerConfig, state: PlannerState, obs: IntervalObservation) -> float:
    """Requests that arrived in the interval: finished + growth of those in the system."""
    now = in_system(obs)
    if not cfg.arrival_estimate or now < 0 or state.in_system < 0:
        return float(obs.num_requests)
    return float(max(obs.num_requests + now - state.in_system, 0))


def _predict(
    cfg: PlannerConfig, state: PlannerState, obs: IntervalObservation
) -> tuple[tuple[tuple[float, ...], ...], Prediction]:
    values = {
        "rps": arrivals(cfg, state, obs) / cfg.adjustment_interval_s,
        "isl": obs.mean_isl,
        "osl": obs.mean_osl,
        "cached": obs.mean_cached_tokens,
    }
    snapshots: list[tuple[float, ...]] = []
    forecast: dict[str, float] = {}
    for name, snapshot in zip(SERIES, state.predictors, strict=True):
        predictor = make_predictor(cfg.predictor, snapshot=snapshot, **cfg.predictor_params)
        if name == "rps" or obs.num_requests > 0:
            predictor.observe(values[name])
        snapshots.append(predictor.snapshot())
        forecast[name] = predictor.predict()
    prediction = Prediction(
        rps=forecast["rps"],
        isl=forecast["isl"],
        osl=forecast["osl"],
        cached=min(forecast["cached"], forecast["isl"]),
    )
    return tuple(snapshots), prediction


def _damp(
    cfg: PlannerConfig, state: PlannerState, role: str, current: int, target: int, ts_s: float
) -> tuple[int, tuple[str, ...]]:
    """Apply cooldowns and the one-step-down rule to a role's raw target."""
    if target > current:
        last_up = dict(state.last_scale_up_ts).get(role)
        if last_up is not None and ts_s - last_up < cfg.scale_up_cooldown_s:
            left = cfg.scale_up_cooldown_s - (ts_s - last_up)
            return current, (f"hold: scale-up cooldown, {left:.0f}s left",)
        return target, ()
    if target < current:
        last_change = dict(state.last_change_ts).get(role, state.start_ts_s)
        since = ts_s - (last_change if last_change is not None else ts_s)
        if dict(state.last_scale_up_interval).get(role) == state.interval_index:
            return current, ("hold: scaled up in the previous interval",)
        if since < cfg.scale_down_cooldown_s:
            left = cfg.scale_down_cooldown_s - since
            return current, (f"hold: scale-down cooldown, {left:.0f}s left",)
        step = max(target, current - cfg.scale_down_step)
        return step, ("scale down one step" if step == current - 1 else f"scale down to {step}",)
    return current, ()


def floor_for(cfg: PlannerConfig, role: str, obs: IntervalObservation) -> int:
    """The fewest replicas ``role`` may have: its minimum, plus the workers started by hand."""
    return cfg.min_for(role) + obs.unmanaged.get(role, 0)


def _bound(
    cfg: PlannerConfig, role: str, obs: IntervalObservation, desired: int
) -> tuple[int, tuple[str, ...]]:
    current, hand = obs.replicas[role], obs.unmanaged.get(role, 0)
    low = floor_for(cfg, role, obs)
    high = max(cfg.max_for(role), low)
    if desired < low:
        what = f"min {cfg.min_for(role)}" + (f" + {hand} started by hand" if hand else "")
        return low, (f"raised to {what}" if current < low else f"hold: at {what}",)
    if desired > high:
        return high, (f"capped at max {high}",)
    return desired, ()


def _budget(
    cfg: PlannerConfig, obs: IntervalObservation, current: dict[str, int], desired: dict[str, int]
) -> dict[str, int]:
    """Cut ``desired`` to ``max_total_replicas``: largest increase first, then largest role."""
    desired = dict(desired)
    while sum(desired.values()) > cfg.max_total_replicas:
        candidates = [r for r in sorted(desired) if desired[r] > floor_for(cfg, r, obs)]
        if not candidates:
            break
        role = max(candidates, key=lambda r: (desired[r] - current[r], desired[r]))
        desired[role] -= 1
    return desired


def plan(
    cfg: PlannerConfig, state: PlannerState, obs: IntervalObservation
) -> tuple[PlannerState, list[Decision]]:
    """Plan one interval; see the module docstring for the policy."""
    correction = _correct(cfg, state.correction, obs)
    snapshots, prediction = _predict(cfg, state, obs)
    if state.start_ts_s is None:
        state = replace(state, start_ts_s=obs.ts_s)
    current = {role: obs.replicas[role] for role in sorted(obs.replicas)}
    desired: dict[str, int] = {}
    reasons: dict[str, tuple[str, ...]] = {}
    drain_s = cfg.backlog_drain_s or cfg.adjustment_interval_s
    for role, now in current.items():
        if cfg.mode == "throughput":
            waiting = obs.total_waiting.get(role, 0)
            sized = replace(prediction, rps=prediction.rps + waiting / drain_s)
            target, why = throughput_target(cfg, correction, sized, role, now)
            if waiting:
                why = (*why, f"incl. {waiting} waiting drained in {drain_s:.0f}s")
        else:
            target, why = load_target(cfg, obs, role, now)
        damped, why_damped = _damp(cfg, state, role, now, target, obs.ts_s)
        bounded, why_bound = _bound(cfg, role, obs, damped)
        desired[role] = bounded
        reasons[role] = why + why_damped + why_bound
    capped = _budget(cfg, obs, current, desired)
    interval = state.interval_index + 1
    up_ts, change_ts, up_iv = (
        state.last_scale_up_ts,
        state.last_change_ts,
        state.last_scale_up_interval,
    )
    decisions: list[Decision] = []
    counter = state.decision_counter
    for role, now in current.items():
        want = capped[role]
        why = reasons[role]
        if want != desired[role]:
            why = (*why, f"cut to {want} by GPU budget {cfg.max_total_replicas}")
        if want > now:
            up_ts = _set(up_ts, role, obs.ts_s)
            up_iv = _set(up_iv, role, interval)
        if want != now:
            change_ts = _set(change_ts, role, obs.ts_s)
        counter += 1
        decisions.append(
            Decision(
                role=role,
                current=now,
                desired=want,
                reasons=why,
                predicted_rps=prediction.rps,
                predicted_isl=prediction.isl,
                predicted_osl=prediction.osl,
                decision_id=counter,
                ts_s=obs.ts_s,
                unmanaged=obs.unmanaged.get(role, 0),
            )
        )
    new_state = replace(
        state,
        interval_index=interval,
        decision_counter=counter,
        last_scale_up_ts=up_ts,
        last_change_ts=change_ts,
        last_scale_up_interval=up_iv,
        predictors=snapshots,
        correction=correction,
        in_system=in_system(obs),
    )
    return new_state, decisions
