"""Load predictors: forecast the next interval's value of a per-interval series.

The planner feeds each predictor one value per adjustment interval (request rate in requests/s,
mean input sequence length in tokens, mean output sequence length in tokens, mean cached prompt
tokens) and asks for the value of the next interval. Every predictor follows one protocol:

- ``observe(value)`` adds the value of the interval that just ended;
- ``predict()`` returns the forecast for the next interval, never negative (0.0 before any data);
- ``snapshot()`` returns the whole state as a tuple of floats, and ``make_predictor(name,
  snapshot=..., **params)`` rebuilds an equal predictor from it. The planner core keeps only
  snapshots in its frozen state, so a replay over the same inputs makes the same decisions.

Predictors (``name`` for ``make_predictor``):

- ``"constant"``: ``ConstantPredictor`` - the last value seen. Reacts at once, no smoothing.
- ``"moving_average"``: ``MovingAveragePredictor(window)`` - the mean of the last ``window``
  values (``window`` >= 1, default 5). Smooths noise; lags a ramp by about ``window / 2``
  intervals.
- ``"holt"``: ``HoltPredictor(alpha, beta)`` - double exponential smoothing (Holt's linear
  trend). ``level = alpha * x + (1 - alpha) * (level + trend)``, ``trend = beta * (level -
  previous level) + (1 - beta) * trend``; the forecast is ``level + trend`` (one step ahead),
  clamped at 0. ``alpha`` in (0, 1] weighs new values against the level (default 0.5), ``beta``
  in [0, 1] weighs the newest slope against the trend (default 0.3). The first value sets the
  level with trend 0. Follows a ramp without lag once the trend is learnt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Predictor(Protocol):
    """What the planner needs from a predictor."""

    def observe(self, value: float) -> None: ...

    def predict(self) -> float: ...

    def snapshot(self) -> tuple[float, ...]: ...


class ConstantPredictor:
    """Forecast = the last value observed."""

    def __init__(self, snapshot: tuple[float, ...] = ()) -> None:
        self._last: float | None = snapshot[0] if snapshot else None

    def observe(self, value: float) -> None:
        self._last = float(value)

    def predict(self) -> float:
        return max(0.0, self._last) if self._last is not None else 0.0

    def snapshot(self) -> tuple[float, ...]:
        return () if self._last is None else (self._last,)


class MovingAveragePredictor:
    """Forecast = the mean of the last ``window`` values."""

    def __init__(self, window: int = 5, snapshot: tuple[float, ...] = ()) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = window
        self._values: tuple[float, ...] = tuple(snapshot[-window:])

    def observe(self, value: float) -> None:
        self._values = (*self._values, float(value))[-self.window :]

    def predict(self) -> float:
        if not self._values:
            return 0.0
        return max(0.0, sum(self._values) / len(self._values))

    def snapshot(self) -> tuple[float, ...]:
        return self._values


class HoltPredictor:
    """Double exponential smoothing (level + trend); forecast one interval ahead."""

    def __init__(
        self, alpha: float = 0.5, beta: float = 0.3, snapshot: tuple[float, ...] = ()
    ) -> None:
        if not 0.0 < alpha <= 1.0 or not 0.0 <= beta <= 1.0:
            raise ValueError("alpha must be in (0, 1] and beta in [0, 1]")
        self.alpha = alpha
        self.beta = beta
        self._level: float | None = None
        self._trend = 0.0
        if snapshot:
            self._level, self._trend = snapshot[0], snapshot[1]

    def observe(self, value: float) -> None:
        x = float(value)
        if self._level is None:
            self._level = x
            return
        previous = self._level
        self._level = self.alpha * x + (1.0 - self.alpha) * (previous + self._trend)
        self._trend = self.beta * (self._level - previous) + (1.0 - self.beta) * self._trend

    def predict(self) -> float:
        if self._level is None:
            return 0.0
        return max(0.0, self._level + self._trend)

    def snapshot(self) -> tuple[float, ...]:
        return () if self._level is None else (self._level, self._trend)


_FACTORIES: dict[str, Callable[..., Predictor]] = {
    "constant": ConstantPredictor,
    "moving_average": MovingAveragePredictor,
    "holt": HoltPredictor,
}

PREDICTOR_NAMES: tuple[str, ...] = tuple(_FACTORIES)


def make_predictor(name: str, snapshot: tuple[float, ...] = (), **params: float) -> Predictor:
    """Build the predictor ``name`` with ``params``, restored from ``snapshot`` if given."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ValueError(f"unknown predictor {name!r}; choose one of {PREDICTOR_NAMES}") from None
    if name == "moving_average" and "window" in params:
        params = {**params, "window": int(params["window"])}
    return factory(snapshot=snapshot, **params)
