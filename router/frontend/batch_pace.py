"""How many Batch API lines a frontend keeps in flight: as many as the interactive requests can
bear. A pure core (no clock, no I/O): the batch service feeds it what it sees and asks it once a
window.

A batch fills idle capacity; it must not slow the interactive requests down. Its lines run at a
lower priority, so an engine schedules an interactive prompt first, but a line already running
still lengthens the engine's steps, and every line costs the frontend CPU. So the number of lines
in flight is controlled as TCP controls a window (additive increase, multiplicative decrease),
from two signals:

- the **interactive time to first token**, a delay signal (as TCP Vegas, BBR or Swift use): its
  ``quantile`` over the last ``judge_windows`` windows against the same quantile of the *quiet*
  samples, those taken while at most ``quiet_lines`` lines were in flight during the last
  ``baseline_windows`` windows. More than ``slack`` above it: the batch is in the way. When no
  quiet sample is that recent, the limit drops to ``quiet_lines`` for ``probe_windows`` windows
  to take some (as BBR's ProbeRTT);
- the frontend's **event-loop lag**: above ``lag_ms``, its CPU is short (the batch competes with
  the interactive requests for the process itself).

Either halves the limit (below one line: none, the batch waits); a window without them adds one
line, up to ``ceiling``, or doubles it while the limit has never been cut (a slow start). Too few
samples (``min_samples``) are no signal: no interactive traffic, nothing to protect.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


@dataclass
class BatchPace:
    ceiling: int = 16
    slack: float = 0.05
    quantile: float = 0.9
    lag_ms: float = 25.0
    judge_windows: int = 3
    baseline_windows: int = 20
    quiet_lines: int = 1
    probe_windows: int = 2
    min_samples: int = 30
    limit: float = 1.0
    slow_start: bool = True
    _window: int = 0
    _recent: deque[list[float]] = field(default_factory=deque)  # the last judge_windows
    _quiet: deque[tuple[int, float]] = field(default_factory=deque)  # (window, seconds)
    _lag: float = 0.0
    _probe_left: int = 0

    def __post_init__(self) -> None:
        if self.ceiling < 1 or self.quiet_lines < 0:
            raise ValueError("ceiling must be at least 1 and quiet_lines at least 0")
        self.limit = min(max(self.limit, 1.0), float(self.ceiling))
        self._recent.append([])

    @property
    def lines(self) -> int:
        """Lines that may be in flight now."""
        if self._probe_left:
            return self.quiet_lines
        return int(self.limit)

    def ttft(self, seconds: float, quiet: bool) -> None:
        """An interactive request's time to first token; ``quiet``: at most ``quiet_lines``
        lines were in flight from its arrival to its first token."""
        self._recent[-1].append(seconds)
        if quiet:
            self._quiet.append((self._window, seconds))

    def lag(self, ms: float) -> None:
        """A sample of the event loop's lag (how late a timer fired)."""
        self._lag = max(self._lag, ms)

    def baseline(self) -> float | None:
        """The quiet samples' quantile (None: too few)."""
        if len(self._quiet) < self.min_samples:
            return None
        return _quantile([s for _, s in self._quiet], self.quantile)

    def window(self) -> int:
        """A window ended: the new limit from what it saw."""
        self._window += 1
        while self._quiet and self._quiet[0][0] < self._window - self.baseline_windows:
            self._quiet.popleft()
        congested = self._lag > self.lag_ms
        self._lag = 0.0
        recent = [s for w in self._recent for s in w]
        base = self.baseline()
        if base is not None and len(recent) >= self.min_samples:
            congested |= _quantile(recent, self.quantile) > base * (1.0 + self.slack)
        self._recent.append([])
        while len(self._recent) > self.judge_windows:
            self._recent.popleft()
        if self._probe_left:
            self._probe_left -= 1
            return self.lines
        if base is None and len(recent) >= self.min_samples and self.limit > self.quiet_lines:
            self._probe_left = self.probe_windows  # nothing quiet to judge by: take some
            return self.lines
        if congested:
            self.slow_start = False
            self.limit = self.limit / 2 if self.limit >= 2 else 0.0
            self._recent = deque([[]])  # judge the new limit on its own samples
        elif self.slow_start:
            self.limit = min(float(self.ceiling), max(self.limit * 2, 1.0))
        else:
            self.limit = min(float(self.ceiling), self.limit + 1)
        return self.lines
