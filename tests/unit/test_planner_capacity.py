"""Capacity profile: mocker-derived default, JSON round trip, online correction."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.capacity import (
    DEFAULT_PROFILE,
    CapacityProfile,
    OnlineCorrection,
    load_profile,
    mocker_profile,
    save_profile,
)


def test_default_is_the_mocker_at_speedup_1():
    # prefill of 2048 tokens: 49.37 ms; decode at kv 0.8: 32.47 ms for 256 sequences; x 0.8.
    assert DEFAULT_PROFILE.prefill_tokens_per_s == pytest.approx(0.8 * 2048 / 0.049365, rel=1e-3)
    assert DEFAULT_PROFILE.decode_tokens_per_s == pytest.approx(0.8 * 256 / 0.032466, rel=1e-3)
    fast = mocker_profile(speedup=10.0)
    assert fast.prefill_tokens_per_s == pytest.approx(10 * DEFAULT_PROFILE.prefill_tokens_per_s)
    assert DEFAULT_PROFILE.scaled(2.0).decode_tokens_per_s == pytest.approx(
        2 * DEFAULT_PROFILE.decode_tokens_per_s
    )


def test_json_round_trip(tmp_path: Path):
    profile = CapacityProfile(12000.0, 3000.0, description="h100 llama-8b")
    path = tmp_path / "profile.json"
    save_profile(profile, path)
    assert load_profile(path) == profile
    assert CapacityProfile.from_dict({"prefill_tokens_per_s": 1, "decode_tokens_per_s": 2}) == (
        CapacityProfile(1.0, 2.0)
    )


@pytest.mark.parametrize("bad", [(0.0, 1.0), (1.0, -1.0)])
def test_rejects_non_positive(bad: tuple[float, float]):
    with pytest.raises(ValueError):
        CapacityProfile(*bad)


@pytest.mark.parametrize(
    ("observed_s", "target_s", "expected"),
    [
        (1.0, 1.0, 1.0),  # on target: unchanged
        (2.0, 1.0, 0.85),  # twice too slow: 0.7 + 0.3 * 0.5
        (0.5, 1.0, 1.1),  # twice faster: 0.7 + 0.3 * 2 = 1.3, raised by 10% at most
        (0.9, 1.0, 1.0333),  # a little faster: 0.7 + 0.3 / 0.9
        (0.0, 1.0, 1.0),  # no data
        (1000.0, 1.0, 0.7003),
    ],
)
def test_correction_one_update(observed_s: float, target_s: float, expected: float):
    corr = OnlineCorrection(max_factor=4.0).update("prefill", observed_s, target_s)
    assert corr.factor("prefill") == pytest.approx(expected, abs=1e-4)
    assert corr.factor("decode") == 1.0


@pytest.mark.parametrize(("observed_s", "bound"), [(100.0, 0.25), (0.001, 4.0)])
def test_correction_is_clamped(observed_s: float, bound: float):
    corr = OnlineCorrection(max_factor=4.0)
    for _ in range(100):
        corr = corr.update("decode", observed_s, 1.0)
    assert corr.factor("decode") == pytest.approx(bound)


def test_default_correction_never_trusts_more_than_the_profile():
    corr = OnlineCorrection()
    for _ in range(50):  # far below target for a long time: still the profile, no more
        corr = corr.update("decode", 0.001, 1.0)
    assert corr.factor("decode") == 1.0
    corr = corr.update("decode", 4.0, 1.0)  # a miss takes trust away...
    missed = corr.factor("decode")
    assert missed < 1.0
    corr = corr.update("decode", 0.5, 1.0)  # ...and a good interval gives some back
    assert missed < corr.factor("decode") <= 1.0


def test_correction_applies_to_profile_and_is_immutable():
    profile = CapacityProfile(1000.0, 100.0)
    base = OnlineCorrection()
    slower = base.update("decode", 2.0, 1.0)
    assert base.factor("decode") == 1.0
    assert slower.apply(profile, "decode") == pytest.approx(85.0)
    assert slower.apply(profile, "prefill") == pytest.approx(1000.0)
    with pytest.raises(ValueError):
        profile.capacity("embed")
