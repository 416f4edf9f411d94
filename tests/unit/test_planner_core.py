"""Planner core as a scripted loop: feed intervals, apply decisions as a connector would, assert.

Profile used throughout: one replica prefills 10k tokens/s and decodes 2k tokens/s; requests have
1000 prompt and 100 output tokens, so an aggregated replica serves 10 rps (prefill-bound), a
prefill replica 10 rps and a decode replica 20 rps. Intervals are 10 s.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import replace

import pytest

from planner.capacity import CapacityProfile
from planner.core import Decision, IntervalObservation, PlannerConfig, PlannerState, plan
from schemas.scaling import ScalingDecided

INTERVAL_S = 10.0
BASE = PlannerConfig(
    adjustment_interval_s=INTERVAL_S,
    predictor="constant",
    profile=CapacityProfile(prefill_tokens_per_s=10_000.0, decode_tokens_per_s=2_000.0),
    default_min_replicas=1,
    default_max_replicas=8,
    max_total_replicas=16,
    scale_up_cooldown_s=30.0,
    scale_down_cooldown_s=60.0,
    scale_down_margin=0.8,
)


def obs(
    i: int,
    rps: float,
    replicas: dict[str, int],
    waiting: dict[str, int] | None = None,
    kv: dict[str, float] | None = None,
    cached: float = 0.0,
    ttft_s: float = 0.0,
) -> IntervalObservation:
    return IntervalObservation(
        ts_s=(i + 1) * INTERVAL_S,
        num_requests=round(rps * INTERVAL_S),
        mean_isl=1000.0,
        mean_osl=100.0,
        p50_ttft_s=ttft_s,
        p90_ttft_s=ttft_s,
        mean_cached_tokens=cached,
        replicas=dict(replicas),
        total_waiting=waiting or {},
        mean_kv_usage=kv or {},
    )


def run(
    cfg: PlannerConfig, rps_series: Sequence[float], replicas: dict[str, int]
) -> list[list[Decision]]:
    """Plan each interval and apply every decision at once (an ideal connector)."""
    state = PlannerState()
    replicas = dict(replicas)
    history = []
    for i, rps in enumerate(rps_series):
        state, decisions = plan(cfg, state, obs(i, rps, replicas))
        for d in decisions:
            replicas[d.role] = d.desired
        history.append(decisions)
    return history


def sizes(history: list[list[Decision]], role: str = "agg") -> list[int]:
    return [next(d.desired for d in ds if d.role == role) for ds in history]


def changes(history: list[list[Decision]]) -> int:
    return sum(d.changed for ds in history for d in ds)


@pytest.mark.parametrize("predictor", ["constant", "moving_average", "holt"])
def test_steady_load_does_not_oscillate(predictor: str):
    rng = random.Random(7)
    series = [25.0 * (1 + rng.uniform(-0.1, 0.1)) for _ in range(100)]
    history = run(replace(BASE, predictor=predictor), series, {"agg": 1})
    assert sizes(history)[0] == 3
    assert changes(history[1:]) <= 1
    assert all(3 <= n <= 4 for n in sizes(history))


@pytest.mark.parametrize("predictor", ["constant", "moving_average", "holt"])
def test_ramp_scales_up_and_never_down(predictor: str):
    series = [5.0 + 3.0 * i for i in range(20)]  # 5 -> 62 rps
    got = sizes(run(replace(BASE, predictor=predictor), series, {"agg": 1}))
    assert got == sorted(got)
    assert got[-1] >= 6
    assert got[0] == 1


def test_burst_scales_up_at_once_then_decays_one_step_per_cooldown():
    series = [7.0] * 3 + [60.0] + [7.0] * 30  # 7 rps fits in one replica at 80%
    history = run(BASE, series, {"agg": 1})
    got = sizes(history)
    assert got[:3] == [1, 1, 1]
    assert got[3] == 6
    downs = [i for i, ds in enumerate(history) if ds[0].desired < ds[0].current]
    assert [got[i - 1] - got[i] for i in downs] == [1] * len(downs)
    assert got[-1] == 1
    # first scale-down waits the cooldown after the scale-up; then one step per cooldown
    ts = [(i + 1) * INTERVAL_S for i in downs]
    assert ts[0] - 4 * INTERVAL_S >= BASE.scale_down_cooldown_s
    assert all(b - a >= BASE.scale_down_cooldown_s for a, b in itertools.pairwise(ts))


def test_decay_waits_for_the_cooldown_from_start():
    history = run(BASE, [60.0] * 2 + [5.0] * 20, {"agg": 6})
    got = sizes(history)
    assert got[:6] == [6] * 6  # start counts as a change: 60 s cooldown
    assert got[6] == 5
    assert "scale down one step" in history[6][0].reasons
    assert any("scale-down cooldown" in r for r in history[2][0].reasons)


def test_no_scale_down_right_after_scale_up():
    cfg = replace(BASE, scale_down_cooldown_s=0.0)
    history = run(cfg, [10.0, 50.0, 5.0, 5.0], {"agg": 1})
    assert sizes(history) == [1, 5, 5, 4]
    assert "hold: scaled up in the previous interval" in history[2][0].reasons


def test_scale_down_needs_margin():
    # 19 rps needs 2, but 2 replicas at 80% fit only 16 rps -> hold at 3.
    history = run(replace(BASE, scale_down_cooldown_s=0.0), [29.0] + [19.0] * 10, {"agg": 3})
    assert sizes(history) == [3] * 11
    assert any("hold: not within 80%" in r for r in history[-1][0].reasons)


@pytest.mark.parametrize(
    ("rps", "replicas", "min_r", "max_r", "first", "last"),
    [
        (500.0, 1, 1, 8, 8, 8),  # capped at max
        (0.0, 5, 2, 8, 4, 2),  # decays to min, one step at a time, never below
        (0.0, 0, 2, 8, 2, 2),  # raised to min at once
        (10.0, 12, 1, 8, 8, 2),  # above max: cut at once, then decays
    ],
)
def test_bounds(rps: float, replicas: int, min_r: int, max_r: int, first: int, last: int):
    cfg = replace(BASE, min_replicas={"agg": min_r}, max_replicas={"agg": max_r})
    history = run(replace(cfg, scale_down_cooldown_s=0.0), [rps] * 20, {"agg": replicas})
    got = sizes(history)
    assert (got[0], got[-1]) == (first, last)
    assert all(min_r <= n <= max_r for n in got)


def test_gpu_budget_caps_total_across_roles():
    cfg = replace(BASE, max_total_replicas=5, scale_up_cooldown_s=0.0)
    history = run(cfg, [10.0, 40.0, 80.0, 80.0], {"prefill": 1, "decode": 1})
    for ds in history:
        assert sum(d.desired for d in ds) <= 5
    last = {d.role: d for d in history[-1]}
    assert last["prefill"].desired >= 1 and last["decode"].desired >= 1
    assert any("GPU budget" in r for ds in history for d in ds for r in d.reasons)


def test_disaggregated_pools_sized_per_phase_and_cache_shrinks_prefill():
    _, decisions = plan(BASE, PlannerState(), obs(0, 40.0, {"prefill": 1, "decode": 1}))
    got = {d.role: d.desired for d in decisions}
    assert got == {"decode": 2, "prefill": 4}
    _, decisions = plan(
        BASE, PlannerState(), obs(0, 40.0, {"prefill": 1, "decode": 1}, cached=500.0)
    )
    assert {d.role: d.desired for d in decisions}["prefill"] == 2


def test_slow_ttft_corrects_capacity_and_grows_the_pool():
    state = PlannerState()
    replicas = {"agg": 2}
    desired = []
    for i in range(6):  # 15 rps in 2 replicas, TTFT 4x the target: the profile is optimistic
        state, ds = plan(BASE, state, obs(i, 15.0, replicas, ttft_s=2.0))
        replicas["agg"] = ds[0].desired
        desired.append(ds[0].desired)
    assert state.correction.factor("prefill") < 1.0
    assert desired[-1] > 2


def scenario(cfg: PlannerConfig) -> tuple[PlannerState, list[list[Decision]]]:
    rng = random.Random(3)
    state = PlannerState()
    replicas = {"prefill": 1, "decode": 1}
    history = []
    for i in range(60):
        rps = 20.0 + 15.0 * (i % 20 > 10) + rng.uniform(-2.0, 2.0)
        state, decisions = plan(cfg, state, obs(i, rps, replicas, ttft_s=rng.uniform(0.1, 1.0)))
        replicas.update({d.role: d.desired for d in decisions})
        history.append(decisions)
    return state, history


@pytest.mark.parametrize("predictor", ["constant", "moving_average", "holt"])
def test_deterministic_replay(predictor: str):
    cfg = replace(BASE, predictor=predictor)
    assert scenario(cfg) == scenario(cfg)
    ids = [d.decision_id for ds in scenario(cfg)[1] for d in ds]
    assert ids == list(range(1, len(ids) + 1))


LOAD = replace(BASE, mode="load", scale_down_cooldown_s=0.0)


@pytest.mark.parametrize(
    ("waiting", "kv", "expected"),
    [
        (20, 0.5, 4),  # 6.7 waiting/replica > 4
        (0, 0.9, 4),  # kv above 85%
        (6, 0.6, 3),  # within thresholds: hold
        (0, 0.3, 2),  # well below both: one down
        (3, 0.3, 3),  # kv low but 1 waiting/replica is not "well below": hold
    ],
)
def test_load_mode_reacts_within_one_interval(waiting: int, kv: float, expected: int):
    _, decisions = plan(
        LOAD, PlannerState(), obs(0, 10.0, {"agg": 3}, waiting={"agg": waiting}, kv={"agg": kv})
    )
    assert decisions[0].desired == expected
    assert decisions[0].reasons


def test_load_mode_steps_one_at_a_time_with_cooldown():
    cfg = replace(LOAD, scale_up_cooldown_s=20.0)
    state = PlannerState()
    replicas = {"agg": 1}
    got = []
    for i in range(5):
        state, ds = plan(cfg, state, obs(i, 10.0, replicas, waiting={"agg": 100}))
        replicas["agg"] = ds[0].desired
        got.append(ds[0].desired)
    assert got == [2, 2, 3, 3, 4]


def test_decision_to_wire():
    _, decisions = plan(BASE, PlannerState(), obs(0, 25.0, {"agg": 1}))
    wire = decisions[0].to_wire("llama", dry_run=True)
    assert isinstance(wire, ScalingDecided)
    assert (wire.current_replicas, wire.desired_replicas, wire.decision_id) == (1, 3, 1)
    assert wire.predicted_rps == pytest.approx(25.0)
    assert wire.reasons == decisions[0].reasons and wire.dry_run
    assert (wire.model, wire.role, wire.ts_s) == ("llama", "agg", INTERVAL_S)
    assert (wire.predicted_isl, wire.predicted_osl) == (1000.0, 100.0)
    assert not decisions[0].to_wire("llama").dry_run


def test_config_validation():
    with pytest.raises(ValueError):
        PlannerConfig(predictor="kalman")
    with pytest.raises(ValueError):
        PlannerConfig(scale_down_margin=0.0)


def _saturated(i: int, finished: int, running: int, waiting: int) -> IntervalObservation:
    return replace(
        obs(i, finished / INTERVAL_S, {"agg": 1}),
        total_running={"agg": running},
        total_waiting={"agg": waiting},
    )


def test_arrivals_count_the_growth_of_requests_in_the_system():
    # a saturated replica finishes 100 requests per interval whatever arrives; the queue shows
    # the rest: 100 more in the system after the interval means 200 arrived
    cfg = BASE
    state, _ = plan(cfg, PlannerState(), _saturated(0, 100, 10, 0))
    state, ds = plan(cfg, state, _saturated(1, 100, 110, 0))
    assert ds[0].predicted_rps == pytest.approx(20.0)  # (100 + 100) / 10 s
    assert ds[0].desired == 2
    blind = replace(cfg, arrival_estimate=False)
    state, _ = plan(blind, PlannerState(), _saturated(0, 100, 10, 0))
    _, ds = plan(blind, state, _saturated(1, 100, 110, 0))
    assert ds[0].predicted_rps == pytest.approx(10.0)
    assert ds[0].desired == 1


def test_no_worker_reports_means_finished_requests_only():
    state, _ = plan(BASE, PlannerState(), obs(0, 10.0, {"agg": 1}))
    assert state.in_system == -1
    _, ds = plan(BASE, state, obs(1, 10.0, {"agg": 1}))
    assert ds[0].predicted_rps == pytest.approx(10.0)


def test_waiting_requests_are_sized_for_as_backlog():
    # 5 rps fits one replica, but 100 waiting requests drained within one interval need 10 rps
    _, ds = plan(BASE, PlannerState(), _saturated(0, 50, 10, 100))
    assert ds[0].desired == 2
    assert any("100 waiting" in r for r in ds[0].reasons)


def test_scale_down_step_removes_several_replicas_only_when_safe():
    cfg = replace(BASE, scale_down_step=3, scale_down_cooldown_s=0.0)
    history = run(cfg, [75.0] * 2 + [5.0] * 4, {"agg": 8})
    got = sizes(history)
    assert got[:2] == [8, 8]
    assert got[2] == 5  # 8 -> 5: three at once, the most one decision may remove
    assert got[-1] == 1
    assert "scale down to 5" in history[2][0].reasons


@pytest.mark.parametrize(
    "cfg", [replace(BASE, default_min_replicas=0), replace(LOAD, default_min_replicas=0)]
)
def test_scaled_to_zero_comes_back_for_turned_away_requests(cfg: PlannerConfig):
    """At zero replicas the only requests are the ones turned away: no lengths are known (they
    come from finished requests), yet they are demand."""
    turned_away = replace(obs(0, 0.3, {"agg": 0}), mean_isl=0.0, mean_osl=0.0)
    _, decisions = plan(cfg, PlannerState(), turned_away)
    assert decisions[0].desired == 1
    _, idle = plan(cfg, PlannerState(), obs(0, 0.0, {"agg": 0}))
    assert idle[0].desired == 0  # no demand: stays at zero


# -------------------------------------------- the online correction, at each of its edges
# BASE: a replica prefills 10k tokens/s. 100 requests in a 10 s interval of 1000 prompt tokens
# = 10k tokens/s of prefill demand: half of two replicas, exactly the default 0.5 utilisation
# from which a pool counts as loaded enough to judge the profile by its latency.
def _corrected(n: int = 100, replicas: dict[str, int] | None = None, **kw: float):
    from planner.capacity import OnlineCorrection
    from planner.core import _correct

    o = replace(obs(0, 0.0, replicas or {"agg": 2}), num_requests=n, **kw)
    return _correct(BASE, OnlineCorrection(), o)


def test_the_correction_judges_a_loaded_pool_even_on_target():
    assert _corrected(p90_ttft_s=0.5).factors == (("prefill", 1.0),)  # at 0.5 util, on target
    assert _corrected(99, p90_ttft_s=0.5).factors == ()  # just under: latency says nothing


def test_the_correction_judges_any_pool_that_misses_its_target():
    corr = _corrected(10, p90_ttft_s=1.0)  # 5% utilised but 2x over target: distrust
    assert corr.factor("prefill") == pytest.approx(0.85)  # 0.7 + 0.3 * 0.5
    assert _corrected(1, {"agg": 1}, p90_ttft_s=0.75).factor("prefill") < 1.0


def test_cached_tokens_are_not_prefill_demand():
    assert _corrected(100, p90_ttft_s=0.5, mean_cached_tokens=10.0).factors == ()


def test_no_requests_no_latency_or_no_pool_for_the_phase_change_nothing():
    assert _corrected(0, p90_ttft_s=2.0).factors == ()
    assert _corrected(100).factors == ()  # no TTFT measured
    assert _corrected(100, {"decode": 2}, p90_ttft_s=2.0).factors == ()  # nobody prefills


def test_decode_is_judged_by_itl_even_without_a_ttft():
    corr = _corrected(10, itl_s=0.1)  # ITL 2x its 50 ms target
    assert corr.factor("decode") == pytest.approx(0.85) and corr.factor("prefill") == 1.0


def test_the_gpu_budget_cuts_the_largest_increase_first_down_to_the_minimums():
    from planner.core import _budget

    cfg = replace(BASE, max_total_replicas=6, default_min_replicas=1)
    o = IntervalObservation(ts_s=1.0, num_requests=0)
    assert _budget(cfg, o, {"a": 2, "b": 2}, {"a": 5, "b": 3}) == {"a": 3, "b": 3}
    assert _budget(cfg, o, {"a": 1, "b": 1}, {"a": 3, "b": 3}) == {"a": 3, "b": 3}  # fits
    assert _budget(cfg, o, {"a": 4, "b": 4}, {"a": 4, "b": 4}) == {"a": 3, "b": 3}  # largest
    tight = replace(cfg, max_total_replicas=1)
    assert _budget(tight, o, {"a": 1, "b": 1}, {"a": 2, "b": 2}) == {"a": 1, "b": 1}  # minimums
    by_hand = replace(o, unmanaged={"a": 2})  # a's floor is 1 + 2 started by hand
    assert _budget(tight, by_hand, {"a": 3, "b": 1}, {"a": 4, "b": 2}) == {"a": 3, "b": 1}


# ---------------------------------------------------------- workers started by hand
def test_a_worker_started_by_hand_never_takes_the_owned_workers_below_the_minimum():
    """Idle, min 1: one owned worker plus one started by hand. The hand-started one counts
    as capacity but may leave at any time, so the planner holds both rather than have its
    connector stop the only worker it owns."""
    cfg = replace(BASE, scale_down_cooldown_s=0.0)
    state = PlannerState()
    o = replace(obs(0, 0.0, {"agg": 2}), unmanaged={"agg": 1})
    for i in range(5):
        state, [d] = plan(cfg, state, replace(o, ts_s=(i + 1) * INTERVAL_S))
        assert (d.current, d.desired, d.unmanaged) == (2, 2, 1)
    assert d.reasons[-1] == "hold: at min 1 + 1 started by hand"
    assert d.to_wire("m").unmanaged_replicas == 1
    # without the hand-started worker in the count, the same fleet scales down to one
    _, [d] = plan(cfg, state, replace(o, unmanaged={}, ts_s=99 * INTERVAL_S))
    assert d.desired == 1


def test_owned_workers_above_the_minimum_still_give_way_to_one_started_by_hand():
    """Five owned + one by hand, idle: down one step at a time to min 1 + the one by hand."""
    cfg = replace(BASE, scale_down_cooldown_s=0.0)
    state, n = PlannerState(), 6
    for i in range(8):
        o = replace(obs(i, 0.0, {"agg": n}), unmanaged={"agg": 1})
        state, [d] = plan(cfg, state, o)
        n = d.desired
    assert n == 2


def test_the_floor_with_hand_started_workers_overrides_the_max():
    cfg = replace(BASE, max_replicas={"agg": 2})
    _, [d] = plan(cfg, PlannerState(), replace(obs(0, 0.0, {"agg": 3}), unmanaged={"agg": 2}))
    assert d.desired == 3  # min 1 owned + 2 by hand, although max is 2


# ------------------------------------------- load mode's thresholds, exactly at their edges
# Defaults: high = 4 waiting/replica or 85% KV, low = 0.5 waiting/replica and 40% KV.
@pytest.mark.parametrize(
    ("current", "waiting", "kv", "requests", "target", "says"),
    [
        (2, 8, 0.5, 10, 2, "waiting 4.0/replica, kv 50%: within thresholds"),  # at high: hold
        (2, 9, 0.5, 10, 3, "waiting 4.5/replica, kv 50%: above threshold"),
        (2, 0, 0.85, 10, 2, "waiting 0.0/replica, kv 85%: within thresholds"),
        (2, 0, 0.86, 10, 3, "waiting 0.0/replica, kv 86%: above threshold"),
        (2, 1, 0.4, 10, 1, "waiting 0.5/replica, kv 40%: well below thresholds"),  # at low
        (2, 2, 0.4, 10, 2, "waiting 1.0/replica, kv 40%: within thresholds"),
        (2, 1, 0.41, 10, 2, "waiting 0.5/replica, kv 41%: within thresholds"),
        (1, 0, 0.0, 10, 0, "waiting 0.0/replica, kv 0%: well below thresholds"),
        (0, 0, 0.0, 1, 1, "1 requests with no replica"),  # one turned-away request is demand
        (0, 0, 0.0, 0, 0, "waiting 0.0/replica, kv 0%: within thresholds"),
        (3, 0, 0.0, 10, 2, "waiting 0.0/replica, kv 0%: well below thresholds"),  # one step
    ],
)
def test_load_rule_at_each_threshold(
    current: int, waiting: int, kv: float, requests: int, target: int, says: str
) -> None:
    from planner.rules import load_target

    o = replace(
        obs(0, 0.0, {"agg": current}, waiting={"agg": waiting}, kv={"agg": kv}),
        num_requests=requests,
    )
    assert load_target(BASE, o, "agg", current) == (target, (says,))


def test_a_role_without_a_waiting_report_counts_none() -> None:
    from planner.rules import load_target

    o = replace(obs(0, 0.0, {"agg": 1}), num_requests=5)
    assert load_target(BASE, o, "agg", 1)[0] == 0


def test_bounds_name_what_they_did() -> None:
    from planner.core import _bound

    cfg = replace(BASE, default_min_replicas=2, default_max_replicas=4)

    def at(current: int) -> IntervalObservation:
        return IntervalObservation(ts_s=1.0, num_requests=0, replicas={"agg": current})

    # _bound(cfg, role, observation with current, desired)
    assert _bound(cfg, "agg", at(1), 1) == (2, ("raised to min 2",))
    assert _bound(cfg, "agg", at(2), 1) == (2, ("hold: at min 2",))
    assert _bound(cfg, "agg", at(3), 2) == (2, ())  # at the minimum: nothing to say
    assert _bound(cfg, "agg", at(3), 4) == (4, ())  # at the maximum too
    assert _bound(cfg, "agg", at(3), 5) == (4, ("capped at max 4",))
    per_role = replace(cfg, max_replicas={"agg": 6})
    assert _bound(per_role, "agg", at(3), 6) == (6, ())


def test_in_system_and_arrivals_edges() -> None:
    from planner.core import arrivals, in_system

    base = obs(0, 1.0, {"agg": 1})  # 10 finished in the interval
    only_running = replace(base, total_running={"agg": 3})
    assert in_system(base) == -1 and in_system(only_running) == 3
    assert in_system(replace(only_running, total_waiting={"agg": 2})) == 5
    cfg = replace(BASE, arrival_estimate=True)
    empty = replace(base, total_running={"agg": 0})
    assert arrivals(cfg, replace(PlannerState(), in_system=0), empty) == 10.0  # 0 known, not -1
    assert arrivals(cfg, replace(PlannerState(), in_system=2), empty) == 8.0  # 10 + 0 - 2
    assert arrivals(cfg, replace(PlannerState(), in_system=-1), only_running) == 10.0
    drained = replace(base, num_requests=0, total_running={"agg": 0})
    assert arrivals(cfg, replace(PlannerState(), in_system=5), drained) == 0.0


def test_cooldowns_say_how_long_is_left_and_ids_count_intervals():
    history = run(BASE, [60.0] * 2 + [5.0] * 5, {"agg": 6})
    reasons = [r for d in (ds[0] for ds in history) for r in d.reasons if "cooldown" in r]
    # start at t=10 counts as a change; the load drops at t=30: 60 - 20 = 40 s left, then 30...
    assert reasons[:3] == [
        "hold: scale-down cooldown, 40s left",
        "hold: scale-down cooldown, 30s left",
        "hold: scale-down cooldown, 20s left",
    ]
    assert [ds[0].decision_id for ds in history] == list(range(1, 8))
    up = run(replace(BASE, scale_up_cooldown_s=30.0), [10.0, 30.0, 60.0], {"agg": 1})
    assert up[2][0].reasons[-1] == "hold: scale-up cooldown, 20s left"  # up at t=20, now t=30


def test_the_budget_cuts_the_largest_increase_not_the_largest_sum():
    from planner.core import _budget

    cfg = replace(BASE, max_total_replicas=7, default_min_replicas=1)
    # a grows 0 -> 4 (+4), b holds at 5 (+0): a is cut first although b is larger
    o = IntervalObservation(ts_s=1.0, num_requests=0)
    assert _budget(cfg, o, {"a": 0, "b": 5}, {"a": 4, "b": 5}) == {"a": 2, "b": 5}
    per_role_min = replace(cfg, min_replicas={"a": 3})
    assert _budget(per_role_min, o, {"a": 0, "b": 5}, {"a": 4, "b": 5}) == {"a": 3, "b": 4}


def test_predictors_carry_their_history_across_intervals():
    cfg = replace(BASE, predictor="moving_average")
    history = run(cfg, [10.0, 30.0], {"agg": 4})
    assert history[-1][0].predicted_rps == pytest.approx(20.0)  # mean of both, not the last
    state = PlannerState()
    for i in range(3):
        state, _ = plan(BASE, state, obs(i, 10.0, {"agg": 2}))
    assert state.interval_index == 3


def test_lengths_are_predicted_only_from_intervals_that_finished_requests():
    cfg = replace(BASE, predictor="moving_average")
    state = PlannerState()
    state, _ = plan(cfg, state, obs(0, 1.0, {"agg": 1}))  # isl 1000, osl 100
    idle = replace(obs(1, 0.0, {"agg": 1}), mean_isl=0.0, mean_osl=0.0)
    state, ds = plan(cfg, state, idle)
    assert (ds[0].predicted_isl, ds[0].predicted_osl) == (1000.0, 100.0)
    one = replace(obs(2, 0.0, {"agg": 1}), num_requests=1, mean_isl=400.0, mean_osl=40.0)
    _, ds = plan(cfg, state, one)
    assert (ds[0].predicted_isl, ds[0].predicted_osl) == (700.0, 70.0)  # one request counts


def test_the_phase_that_needs_more_replicas_names_the_need():
    from planner.capacity import OnlineCorrection
    from planner.rules import Prediction, throughput_target

    # decode-heavy: 10 rps x 1000 output tokens = 10k tokens/s of decode against 2k per replica
    pred = Prediction(rps=10.0, isl=100.0, osl=1000.0, cached=0.0)
    target, why = throughput_target(BASE, OnlineCorrection(), pred, "agg", 1)
    assert target == 5 and why[0].endswith("needs 5 replicas (decode)")


def test_arrivals_count_growth_from_an_empty_system():
    from planner.core import arrivals

    cfg = replace(BASE, arrival_estimate=True)
    now3 = replace(obs(0, 1.0, {"agg": 1}), total_running={"agg": 3})
    assert arrivals(cfg, replace(PlannerState(), in_system=0), now3) == 13.0  # 10 done + 3 new


def test_one_replica_with_five_waiting_is_over_the_queue_threshold():
    from planner.rules import load_target

    o = obs(0, 1.0, {"agg": 1}, waiting={"agg": 5})
    assert load_target(BASE, o, "agg", 1)[0] == 2


def test_fully_cached_prompts_need_no_prefill():
    from planner.rules import Prediction, replicas_needed

    assert Prediction(rps=10.0, isl=100.0, osl=10.0, cached=100.0).demand("prefill") == 0.0
    assert replicas_needed(0.5, 10_000.0) == 1  # any demand at all needs a replica
    assert replicas_needed(0.0, 10_000.0) == 0
    # 10k rps of fully cached prompts on two replicas, TTFT on target: not a loaded pool
    assert _corrected(100_000, p90_ttft_s=0.5, mean_cached_tokens=1000.0).factors == ()


def test_holding_steady_says_only_what_it_predicts():
    history = run(replace(BASE, scale_up_cooldown_s=30.0), [10.0, 30.0, 30.0], {"agg": 1})
    steady = history[2][0]  # 30 rps on the 3 replicas it scaled to: nothing to do
    assert steady.desired == steady.current == 3
    assert steady.reasons == ("predicted 30.0 rps (isl 1000, osl 100) needs 3 replicas (prefill)",)


def test_predictor_parameters_reach_the_predictor():
    cfg = replace(BASE, predictor="moving_average", predictor_params={"window": 1})
    history = run(cfg, [10.0, 30.0], {"agg": 4})
    assert history[-1][0].predicted_rps == pytest.approx(30.0)  # a window of one: the last
