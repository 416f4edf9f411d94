"""vLLM's scheduler stats, kept for ``VllmEngine.load()``.

vLLM's ``AsyncLLM`` calls every stat logger it was given (``stat_loggers=[factory]``) with
``record(scheduler_stats, iteration_stats, ...)`` after each engine step, on the event loop
(its output handler task). ``stat_logger_class`` builds such a logger around a
``SchedulerStatsCollector``, subclassing vLLM's ``StatLoggerBase`` (passed in: this module does
not import vLLM). The collector is pure and reads, each step:

- ``SchedulerStats.num_running_reqs`` / ``num_waiting_reqs``;
- ``SchedulerStats.kv_cache_usage`` (0..1, under that name in every supported release: vLLM
  0.10.0 already had it): the fraction of KV blocks held by requests (free cached blocks count as
  free);
- ``IterationStats.num_preempted_reqs``, summed;
- the time between two records while requests run, as the step time. A record per engine step
  is what vLLM does today; the figure is wall time between steps as the front end sees them.

vLLM documents these stats classes as not stable across versions; the fields above are the same
from 0.10.0 to 0.33.0. vLLM must run with ``disable_log_stats=False`` to produce them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SchedulerSnapshot:
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0  # 0..1
    num_preempted_total: int = 0
    step_ms: float = 0.0  # last measured step time (0 when idle)
    records: int = 0  # how many records were seen (0: no stats yet)


class SchedulerStatsCollector:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._snap = SchedulerSnapshot()
        self._last_busy_at: float | None = None

    def snapshot(self) -> SchedulerSnapshot:
        return self._snap

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        prev = self._snap
        now = self._clock()
        running, waiting, usage = prev.num_running, prev.num_waiting, prev.kv_usage
        if scheduler_stats is not None:
            running = int(scheduler_stats.num_running_reqs)
            waiting = int(scheduler_stats.num_waiting_reqs)
            usage = float(scheduler_stats.kv_cache_usage)
        preempted = prev.num_preempted_total
        if iteration_stats is not None:
            preempted += int(iteration_stats.num_preempted_reqs)
        step_ms = 0.0
        if running > 0:
            if self._last_busy_at is not None:
                step_ms = (now - self._last_busy_at) * 1000.0
            self._last_busy_at = now
        else:
            self._last_busy_at = None
        self._snap = SchedulerSnapshot(
            running, waiting, usage, preempted, step_ms, prev.records + 1
        )


def stat_logger_class(base: type[Any], collector: SchedulerStatsCollector) -> type[Any]:
    """A ``StatLoggerBase`` subclass feeding ``collector``; the class is the factory vLLM
    calls as ``factory(vllm_config, engine_index)``."""

    class FleetStatLogger(base):  # type: ignore[misc]
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(self, scheduler_stats: Any, iteration_stats: Any, *_: Any, **__: Any) -> None:
            collector.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

        def log(self) -> None:
            pass

    return FleetStatLogger
