"""Predictors: forecasts over scripted series, state round-trips, never negative."""

from __future__ import annotations

import pytest

from planner.predictors import (
    PREDICTOR_NAMES,
    ConstantPredictor,
    HoltPredictor,
    MovingAveragePredictor,
    make_predictor,
)


def feed(name: str, series: list[float], **params: float) -> float:
    predictor = make_predictor(name, **params)
    for value in series:
        predictor.observe(value)
    return predictor.predict()


@pytest.mark.parametrize(
    ("name", "params", "series", "expected"),
    [
        ("constant", {}, [], 0.0),
        ("constant", {}, [3.0, 7.0], 7.0),
        ("moving_average", {"window": 3}, [1.0, 2.0, 3.0, 4.0], 3.0),
        ("moving_average", {"window": 10}, [2.0, 4.0], 3.0),
        ("moving_average", {}, [], 0.0),
        ("holt", {}, [], 0.0),
        ("holt", {}, [5.0], 5.0),
        ("holt", {"alpha": 1.0, "beta": 1.0}, [1.0, 2.0, 3.0], 4.0),
        ("holt", {"alpha": 0.5, "beta": 0.5}, [4.0] * 20, 4.0),
    ],
)
def test_forecast(name: str, params: dict[str, float], series: list[float], expected: float):
    assert feed(name, series, **params) == pytest.approx(expected)


def test_holt_follows_a_ramp_better_than_moving_average():
    ramp = [float(i) for i in range(1, 31)]
    holt = feed("holt", ramp, alpha=0.5, beta=0.3)
    average = feed("moving_average", ramp, window=5)
    assert abs(holt - 31.0) < 1.0
    assert average == pytest.approx(28.0)


@pytest.mark.parametrize("name", PREDICTOR_NAMES)
def test_never_negative(name: str):
    assert feed(name, [100.0, 50.0, 0.0, 0.0, -5.0]) >= 0.0


@pytest.mark.parametrize("name", PREDICTOR_NAMES)
def test_snapshot_round_trip(name: str):
    original = make_predictor(name)
    for value in [3.0, 5.0, 4.0, 9.0]:
        original.observe(value)
    restored = make_predictor(name, snapshot=original.snapshot())
    assert restored.predict() == original.predict()
    for predictor in (original, restored):
        predictor.observe(6.0)
    assert restored.snapshot() == original.snapshot()
    assert all(isinstance(x, float) for x in original.snapshot())


def test_factories_and_validation():
    assert isinstance(make_predictor("constant"), ConstantPredictor)
    assert isinstance(make_predictor("moving_average", window=2.0), MovingAveragePredictor)
    assert isinstance(make_predictor("holt", alpha=0.2), HoltPredictor)
    with pytest.raises(ValueError, match="unknown predictor"):
        make_predictor("kalman")
    with pytest.raises(ValueError):
        MovingAveragePredictor(window=0)
    with pytest.raises(ValueError):
        HoltPredictor(alpha=0.0)
