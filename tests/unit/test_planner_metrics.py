"""The planner's metrics: its latency targets are exported, for alerts to compare against."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from planner.config import PlannerConfig
from planner.service import PlannerMetrics


def test_the_latency_targets_are_gauges_of_the_model() -> None:
    registry = CollectorRegistry()
    PlannerMetrics(registry).targets("m", PlannerConfig(ttft_target_s=0.8, itl_target_s=0.03))
    value = registry.get_sample_value
    assert value("jetfleet_planner_ttft_target_seconds", {"model": "m"}) == 0.8
    assert value("jetfleet_planner_itl_target_seconds", {"model": "m"}) == 0.03
