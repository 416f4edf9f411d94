"""The frontend's per-token metric: ``n`` inter-token gaps observed in one step count exactly as
``n`` observations would, bucket boundaries and +Inf included."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from router.frontend.metrics import FrontendMetrics, observe_many

BOUNDS = (0.001, 0.01, 0.1)


def _samples(registry: CollectorRegistry) -> dict[str, float]:
    """Every sample but the creation time, by name and labels."""
    text = generate_latest(registry).decode()
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def _histogram() -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    return registry, Histogram("gaps_seconds", "gaps", ["model"], buckets=BOUNDS, registry=registry)


@pytest.mark.parametrize("value", [0.0, 0.0005, 0.001, 0.005, 0.01, 0.1, 0.25])
def test_n_gaps_at_once_are_n_observations(value: float) -> None:
    one_by_one, slow = _histogram()
    at_once, fast = _histogram()
    for n in (1, 3, 64):
        for _ in range(n):
            slow.labels("m").observe(value)
        observe_many(fast.labels("m"))(value, n)
    want, got = _samples(one_by_one), _samples(at_once)
    assert got == pytest.approx(want)  # the sum: n * value against n additions
    assert [k for k, v in got.items() if v] == [k for k, v in want.items() if v]


def test_a_histogram_without_the_internals_is_observed_one_by_one() -> None:
    class Plain:
        def __init__(self) -> None:
            self.seen: list[float] = []

        def observe(self, value: float) -> None:
            self.seen.append(value)

    plain = Plain()
    observe_many(plain)(0.5, 3)  # type: ignore[arg-type]
    assert plain.seen == [0.5, 0.5, 0.5]


def test_the_frontend_keeps_one_observer_per_model() -> None:
    metrics = FrontendMetrics(CollectorRegistry())
    assert metrics.itl_observer("a") is metrics.itl_observer("a")
    metrics.itl_observer("a")(0.002, 4)
    text = generate_latest(metrics.registry).decode()
    assert 'jetfleet_frontend_inter_token_latency_seconds_count{model="a"} 4.0' in text


def test_discoverys_worker_changes_are_counted_by_change() -> None:
    registry = CollectorRegistry()
    metrics = FrontendMetrics(registry)
    assert (
        registry.get_sample_value("jetfleet_frontend_worker_changes_total", {"change": "left"}) == 0
    )
    for worker_id, change in [("w1", "joined"), ("w1", "left"), ("w1", "joined")]:
        metrics.count_worker_change(worker_id, change)
    value = registry.get_sample_value
    assert value("jetfleet_frontend_worker_changes_total", {"change": "joined"}) == 2
    assert value("jetfleet_frontend_worker_changes_total", {"change": "left"}) == 1
