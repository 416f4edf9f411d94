"""The pure part of ``jetfleet profile``: steps, points from timings, capacity from points."""

from __future__ import annotations

import argparse
import json

import pytest

from infra.profile import add_profile_args, config_from_args
from planner.capacity import CapacityProfile
from planner.config import PlannerConfig
from planner.profile_fit import (
    PhaseCapacity,
    ProfileConfig,
    ProfileError,
    ProfileResult,
    RequestTiming,
    SweepPoint,
    decode_point,
    geometric_steps,
    pick_capacity,
    prefill_point,
    select_worker,
    stagger,
)
from tests.support.builders import fleet_state, registration


@pytest.mark.parametrize(
    ("start", "factor", "maximum", "steps"),
    [
        (1, 2.0, 256, (1, 2, 4, 8, 16, 32, 64, 128, 256)),
        (1, 2.0, 100, (1, 2, 4, 8, 16, 32, 64, 100)),  # always ends on the maximum
        (1, 1.5, 10, (1, 2, 3, 4, 5, 8, 10)),  # rounded, strictly increasing
        (3, 3.0, 81, (3, 9, 27, 81)),
        (1, 2.0, 1, (1,)),
        (8, 2.0, 4, (4,)),  # a start above the maximum runs the maximum only
    ],
)
def test_geometric_steps(start, factor, maximum, steps):
    assert geometric_steps(start, factor, maximum) == steps


@pytest.mark.parametrize(("start", "factor", "maximum"), [(0, 2.0, 8), (1, 1.0, 8), (1, 2.0, 0)])
def test_geometric_steps_rejects_bad_settings(start, factor, maximum):
    with pytest.raises(ValueError):
        geometric_steps(start, factor, maximum)


def test_stagger_spreads_the_first_requests_of_new_slots():
    assert stagger(64, 4) == [16, 32, 48, 64]
    assert stagger(256, 1) == [256]
    assert stagger(1, 3) == [1, 1, 1]  # prefill: one token each
    assert stagger(3, 8) == [1, 1, 2, 2, 2, 3, 3, 3]
    assert stagger(64, 0) == []


def prefill_request(submitted: float, ttft: float, prompt: int = 1000, cached: int = 0):
    first = submitted + ttft
    return RequestTiming(submitted, prompt, first, first, cached_tokens=cached, chunks=[(first, 1)])


def test_prefill_point_counts_uncached_tokens_answered_in_the_window():
    timings = [
        prefill_request(9.0, 1.5),  # sent before the window, answered in it: throughput only
        prefill_request(10.0, 0.1),
        prefill_request(10.5, 0.2, cached=400),
        prefill_request(11.0, 0.3),
        prefill_request(11.5, 0.9),  # sent in the window, answered after it: latency only
        prefill_request(12.0, 0.1),  # after the window: neither
    ]
    point = prefill_point(timings, concurrency=2, t0=10.0, t1=12.0)
    assert point.concurrency == 2
    assert point.window_s == 2.0
    assert point.tokens_per_s == pytest.approx((1000 + 1000 + 600 + 1000) / 2.0)
    assert point.requests == 4
    assert point.latency_s == point.p90_ttft_s == pytest.approx(0.9)  # nearest rank of 4
    assert point.p50_ttft_s == pytest.approx(0.2)
    assert point.cached_tokens == 400


def test_decode_point_is_the_token_weighted_itl_of_the_window():
    # a: one token per chunk every 0.125 s; b: coalesced, 4 tokens per chunk every 0.25 s
    a = RequestTiming(8.9, 10, 9.0, chunks=[(9.0 + 0.125 * i, 1) for i in range(40)])
    b_chunks = [(9.5, 1), (9.75, 4), (10.0, 4), (10.25, 4), (10.5, 4), (10.75, 2)]
    b = RequestTiming(9.4, 10, 9.5, 10.75, chunks=b_chunks)
    old = RequestTiming(1.0, 10, 1.1, 2.0, chunks=[(1.1, 1), (2.0, 9)])  # long gone
    point = decode_point([old, a, b], concurrency=2, t0=10.0, t1=11.0)
    # in [10, 11): a's chunks 10.0 .. 10.875 (8; 10.0 follows 9.875), b's 10.0 .. 10.75 (14 tokens)
    assert point.tokens_per_s == pytest.approx(8 + 14)
    assert point.latency_s == pytest.approx((8 * 0.125 + 4 * 0.25) / (8 + 14))
    assert point.requests == 1  # b finished in the window
    assert point.p50_ttft_s == 0.0  # nobody was sent in it


def test_decode_point_without_tokens_has_no_latency():
    point = decode_point([], concurrency=1, t0=0.0, t1=1.0)
    assert point.tokens_per_s == 0.0 and point.latency_s == 0.0


def pt(concurrency: int, tokens_per_s: float, latency_s: float) -> SweepPoint:
    return SweepPoint(concurrency, 1.0, tokens_per_s, latency_s, 10, 0.0, 0.0, 0)


@pytest.mark.parametrize(
    ("points", "interpolate", "tokens_per_s", "limited_by", "good", "bad"),
    [
        # every step within target: the best of them
        ([pt(1, 100, 0.1), pt(2, 180, 0.2), pt(4, 170, 0.3)], True, 180, "max_concurrency", 4, 0),
        # the target half-way between the last good step and the first bad one
        ([pt(1, 100, 0.1), pt(2, 180, 0.3), pt(4, 300, 0.7)], True, 240, "target", 2, 4),
        ([pt(1, 100, 0.1), pt(2, 180, 0.3), pt(4, 300, 0.7)], False, 180, "target", 2, 4),
        # a bad step with less throughput (saturated) teaches nothing more
        ([pt(1, 100, 0.1), pt(2, 200, 0.3), pt(4, 190, 0.9)], True, 200, "target", 2, 4),
        # an earlier good step beats the interpolation
        ([pt(1, 250, 0.1), pt(2, 100, 0.4), pt(4, 120, 0.6)], True, 250, "target", 2, 4),
        # points after the first bad one are not looked at
        ([pt(1, 100, 0.1), pt(2, 100, 0.9), pt(4, 900, 0.1)], True, 100, "target", 1, 2),
    ],
)
def test_pick_capacity(points, interpolate, tokens_per_s, limited_by, good, bad):
    cap = pick_capacity(points, 0.5, "decode", interpolate)
    assert cap == PhaseCapacity(pytest.approx(tokens_per_s), limited_by, good, bad)


def test_pick_capacity_needs_a_step_within_target():
    with pytest.raises(ProfileError, match=r"no prefill step met the 0.5 s .*concurrency 1"):
        pick_capacity([pt(1, 1000, 0.8)], 0.5, "prefill")
    with pytest.raises(ProfileError, match="no decode step"):
        pick_capacity([], 0.5, "decode")
    with pytest.raises(ProfileError, match="no throughput"):
        pick_capacity([pt(1, 0.0, 0.0)], 0.5, "decode")


def test_select_worker_by_id_or_first_of_the_model():
    state = fleet_state(
        registration("w-b"), registration("w-a"), registration("w-c", model="other")
    )
    assert select_worker(state, "w-c", None).worker_id == "w-c"
    assert select_worker(state, None, "m").worker_id == "w-a"
    assert select_worker(fleet_state(registration("w-z")), None, None).worker_id == "w-z"


@pytest.mark.parametrize(
    ("worker_id", "model", "message"),
    [
        ("w-x", None, r"worker 'w-x' is not live; live workers: w-a \(m\), w-c \(other\)"),
        ("w-d", None, "worker 'w-d' is draining, not ready"),
        ("w-a", "other", "worker 'w-a' serves 'm', not 'other'"),
        (None, "nope", "no live worker serves nope"),
        (None, None, "several models are served"),
    ],
)
def test_select_worker_errors_say_what_is_live(worker_id, model, message):
    state = fleet_state(
        registration("w-a"),
        registration("w-c", "other"),
        registration("w-d", "m", status="draining"),
    )
    with pytest.raises(ProfileError, match=message):
        select_worker(state, worker_id, model)


def test_config_defaults_are_the_planner_targets_and_validated():
    cfg = ProfileConfig()
    assert cfg.ttft_target_s == PlannerConfig().ttft_target_s == 0.5
    assert cfg.itl_target_s == PlannerConfig().itl_target_s == 0.05
    for bad in ({"itl_target_s": 0.0}, {"decode_osl_tokens": 1}, {"step_factor": 1.0}):
        with pytest.raises(ValueError):
            ProfileConfig(**bad)


def test_flags_map_onto_the_config():
    parser = argparse.ArgumentParser()
    add_profile_args(parser)
    assert config_from_args(parser.parse_args([])) == ProfileConfig()
    flags = "--ttft-target 0.2 --itl-target 0.01 --isl 512 --decode-isl 64 --osl 32"
    flags += " --max-concurrency 16 --step-factor 4 --duration 1 --min-requests 5 --timeout 9"
    flags += " --wait 2 --seed 7 --no-interpolate"
    args = parser.parse_args(flags.split())
    assert config_from_args(args) == ProfileConfig(
        ttft_target_s=0.2,
        itl_target_s=0.01,
        prefill_isl_tokens=512,
        decode_isl_tokens=64,
        decode_osl_tokens=32,
        max_concurrency=16,
        step_factor=4.0,
        step_duration_s=1.0,
        prefill_min_requests=5,
        request_timeout_s=9.0,
        wait_for_worker_s=2.0,
        interpolate=False,
        seed=7,
    )
    assert (args.worker_id, args.model, args.out) == (None, None, "profile.json")


def test_result_is_plain_json():
    cap = PhaseCapacity(1234.56789, "target", 2, 4)
    result = ProfileResult(
        CapacityProfile(1234.6, 99.0, "d"),
        registration("w-a"),
        ProfileConfig(),
        cap,
        PhaseCapacity(99.0, "max_concurrency", 8, 0),
        (pt(1, 1000.123456, 0.1234567),),
        (),
    )
    data = json.loads(json.dumps(result.to_dict()))
    assert data["profile"] == {
        "prefill_tokens_per_s": 1234.6,
        "decode_tokens_per_s": 99.0,
        "description": "d",
    }
    assert data["prefill"]["tokens_per_s"] == 1234.56789
    assert data["prefill"]["points"][0]["latency_s"] == 0.12346
    assert data["decode"] == {
        "tokens_per_s": 99.0,
        "limited_by": "max_concurrency",
        "last_good_concurrency": 8,
        "first_bad_concurrency": 0,
        "target_s": 0.05,
        "points": [],
    }
    assert data["worker"]["worker_id"] == "w-a"
