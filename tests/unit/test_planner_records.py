"""Planner records and replay as pure functions: a simulated live run is replayed exactly, and
other settings change the replayed decisions."""

from __future__ import annotations

import random

import msgspec
import pytest

from base.worker_watch import ready_counts
from planner.capacity import CapacityProfile
from planner.config import PlannerConfig
from planner.core import PlannerState, plan
from planner.records import (
    IntervalCollector,
    apply_settings,
    decision_records,
    decode_config,
    decode_state,
    encode_config,
    encode_state,
    observation_for,
)
from planner.replay import group_intervals, parse_time, replay_intervals
from planner.service import reason_kind
from schemas import (
    HeldRequests,
    RequestObservation,
    ScalingDecided,
    Subjects,
    WorkerLoad,
    WorkerRegistration,
    encode,
)
from tests.support.builders import registration

S = Subjects("fleet")
MODEL = "tiny"
CFG = PlannerConfig(
    adjustment_interval_s=10.0,
    profile=CapacityProfile(prefill_tokens_per_s=20_000.0, decode_tokens_per_s=1_000.0),
    scale_up_cooldown_s=10.0,
    scale_down_cooldown_s=20.0,
)


def _obs_msg(i: int, rng: random.Random) -> tuple[str, bytes]:
    o = RequestObservation(
        request_id=f"r{i}",
        model=MODEL,
        status="ok",
        ts_s=float(i),
        isl_tokens=rng.randint(200, 800),
        osl_tokens=rng.randint(20, 60),
        ttft_s=rng.uniform(0.01, 0.3),
        itl_s=rng.uniform(0.005, 0.02),
    )
    return S.obs(MODEL), encode(o)


def _load_msg(worker: str, waiting: int) -> tuple[str, bytes]:
    load = WorkerLoad(worker, MODEL, "agg", 1.0, 4, waiting, 256, 0.3, 1000)
    return S.metrics(MODEL, "agg", worker), encode(load)


def simulate_live(
    rates: list[int], cfg: PlannerConfig = CFG
) -> tuple[list[ScalingDecided], list[tuple[int, str, bytes]]]:
    """What the live service does, interval by interval, with a fleet following the decisions."""
    rng = random.Random(7)
    stream: list[tuple[int, str, bytes]] = []
    seq = 0
    collector = IntervalCollector(S, MODEL)
    state = PlannerState()
    replicas = 1
    records: list[ScalingDecided] = []
    for k, rate in enumerate(rates):
        for i in range(rate):
            subject, data = _obs_msg(k * 1000 + i, rng)
            seq += 1
            stream.append((seq, subject, data))
            collector.add(seq, subject, data)
            seq += 1  # another model's message takes a sequence number in between
        subject, data = _load_msg("w0", rate // 10)
        seq += 1
        stream.append((seq, subject, data))
        collector.add(seq, subject, data)
        inp = collector.close()
        obs = observation_for(inp, 10.0 * (k + 1), {"agg": replicas})
        pre = state
        state, decisions = plan(cfg, pre, obs)
        records += decision_records(MODEL, decisions, cfg, pre, inp, dry_run=False)
        replicas = decisions[0].desired
    return records, stream


RATES = [5, 50, 150, 300, 300, 300, 120, 40, 10, 10, 10, 10]


def test_replay_reproduces_a_live_run_exactly() -> None:
    records, stream = simulate_live(RATES)
    assert any(r.changed for r in records), "the scenario must scale"
    report = replay_intervals(S, MODEL, group_intervals(records), stream)
    assert report.intervals == len(RATES)
    assert len(report.rows) == len(records)
    assert report.differing == 0, [r.differences for r in report.rows if r.differences]


def test_replay_from_the_middle_starts_from_the_recorded_state() -> None:
    records, stream = simulate_live(RATES)
    later = [r for r in records if r.ts_s >= 50.0]
    report = replay_intervals(S, MODEL, group_intervals(later), stream)
    assert report.intervals == len(RATES) - 4
    assert report.differing == 0


def test_replay_notices_a_tampered_record() -> None:
    records, stream = simulate_live(RATES)
    i = next(i for i, r in enumerate(records) if r.changed)
    records[i] = msgspec.structs.replace(
        records[i], desired_replicas=records[i].desired_replicas + 1
    )
    report = replay_intervals(S, MODEL, group_intervals(records), stream)
    assert report.differing == 1
    assert "desired_replicas" in report.rows[i].differences[0]


def test_replay_with_other_settings_decides_differently() -> None:
    records, stream = simulate_live(RATES)
    report = replay_intervals(
        S, MODEL, group_intervals(records), stream, ["profile.decode_tokens_per_s=250"]
    )
    recorded = [r.recorded.desired_replicas for r in report.rows]
    replayed = [r.replayed.desired for r in report.rows]
    assert max(replayed) > max(recorded)
    assert report.differing == 0  # differences are only reported against the live settings


def test_collector_skips_redeliveries_and_reports_undecodable() -> None:
    c = IntervalCollector(S, MODEL)
    subject, data = _obs_msg(1, random.Random(1))
    assert c.add(5, subject, data) is None
    assert c.add(5, subject, data) is None  # redelivered
    assert c.add(3, subject, data) is None  # older than the last seen
    why = c.add(6, subject, b"\xc1garbage")
    assert why is not None
    assert c.add(7, "fleet.obs.other", data) is not None
    inp = c.close()
    assert (inp.after_seq, inp.last_seq, len(inp.observations)) == (0, 7, 1)
    nxt = c.close()
    assert (nxt.after_seq, nxt.last_seq, nxt.observations) == (7, 7, [])


def test_collector_takes_the_requests_frontends_hold() -> None:
    c = IntervalCollector(S, MODEL)
    held = HeldRequests("f1", MODEL, 1.0, {"agg": 4})
    assert c.add(1, S.held(MODEL, "f1"), msgspec.msgpack.encode(held)) is None
    assert c.add(2, S.held("other", "f1"), msgspec.msgpack.encode(held)) is not None
    inp = c.close()
    assert inp.held == [held]
    assert observation_for(inp, 10.0, {"agg": 1}).total_waiting == {"agg": 4}


def test_state_and_config_round_trip() -> None:
    cfg = apply_settings(CFG, ["min_replicas.agg=2", "predictor_params.alpha=0.4"])
    assert decode_config(encode_config(cfg)) == cfg
    state, _ = plan(cfg, PlannerState(), observation_for(_empty(), 10.0, {"agg": 1}))
    assert decode_state(encode_state(state)) == state
    assert decode_state(b"") == PlannerState()


def _empty():  # type: ignore[no-untyped-def]
    return IntervalCollector(S, MODEL).close()


@pytest.mark.parametrize(
    ("setting", "field", "value"),
    [
        ("ttft_target_s=0.25", "ttft_target_s", 0.25),
        ("mode=load", "mode", "load"),
        ("predictor=constant", "predictor", "constant"),
        ("min_replicas.decode=3", "min_replicas", {"decode": 3}),
        ("scale_down_margin=0.7", "scale_down_margin", 0.7),
    ],
)
def test_apply_settings(setting: str, field: str, value: object) -> None:
    assert getattr(apply_settings(CFG, [setting]), field) == value


@pytest.mark.parametrize(
    "setting",
    ["nope=1", "ttft_target_s", "ttft_target_s=-1", "predictor=psychic", "profile.x.y=1", "mode=3"],
)
def test_apply_settings_refuses_bad_input(setting: str) -> None:
    with pytest.raises(ValueError):
        apply_settings(CFG, [setting])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", 1000.0),
        ("-15m", 100.0),
        ("-1h", -2600.0),
        ("10s", 990.0),
        ("1700000000", 1_700_000_000.0),
        ("2023-11-14T22:13:20Z", 1_700_000_000.0),
        ("2023-11-14T22:13:20", 1_700_000_000.0),
    ],
)
def test_parse_time(text: str, expected: float) -> None:
    assert parse_time(text, now_s=1000.0) == expected


def test_parse_time_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        parse_time("yesterday-ish")


def test_reason_kind_has_low_cardinality() -> None:
    assert reason_kind(("hold: scale-down cooldown, 12s left",)) == "hold"
    assert reason_kind(("x", "scale down one step")) == "scale down one step"
    a = reason_kind(("predicted 3.2 rps (isl 500, osl 30) needs 4 replicas (decode)",))
    b = reason_kind(("predicted 9.9 rps (isl 700, osl 20) needs 7 replicas (decode)",))
    assert a == b
    assert reason_kind(()) == "none"


def test_ready_counts() -> None:
    def reg(w: str, role: str, status: str = "ready", beat: float = 100.0) -> WorkerRegistration:
        return registration(w, MODEL, role, status=status, heartbeat_at_s=beat)

    regs = {
        "a": reg("a", "agg"),
        "b": reg("b", "agg", status="draining"),
        "c": reg("c", "agg", beat=50.0),  # stale
        "d": reg("d", "decode"),
        "e": registration("e", "other", heartbeat_at_s=100.0),
    }
    assert ready_counts(regs, MODEL, ("agg", "prefill"), 101.0) == {"agg": 1, "prefill": 0}


def test_only_workers_that_say_they_were_started_by_hand_are_unmanaged() -> None:
    """A worker older than ``managed_by`` says nothing (""): counted as managed, so the floor
    is not raised and a Kubernetes Deployment is never shrunk by an upgrade in progress."""

    def reg(w: str, by: str) -> WorkerRegistration:
        return registration(w, MODEL, heartbeat_at_s=100.0, managed_by=by)

    regs = {w: reg(w, by) for w, by in (("a", "hand"), ("b", ""), ("c", "kubernetes"))}
    assert ready_counts(regs, MODEL, ("agg",), 101.0) == {"agg": 3}
    assert ready_counts(regs, MODEL, ("agg",), 101.0, unmanaged_only=True) == {"agg": 1}
