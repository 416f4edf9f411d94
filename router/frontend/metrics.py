"""Prometheus metrics of a frontend (registry passed in, never global)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LAT = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class FrontendMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        ns = "jetfleet_frontend"
        self.registry = registry
        self.requests = Counter(
            f"{ns}_requests",
            "HTTP requests by endpoint and status",
            ["model", "endpoint", "status"],
            registry=registry,
        )
        self.in_flight = Gauge(f"{ns}_in_flight", "Generations in progress", registry=registry)
        self.ttft = Histogram(
            f"{ns}_ttft_seconds", "Time to first token", ["model"], buckets=_LAT, registry=registry
        )
        self.itl = Histogram(
            f"{ns}_itl_seconds",
            "Mean inter-token latency per request",
            ["model"],
            buckets=_LAT,
            registry=registry,
        )
        self.duration = Histogram(
            f"{ns}_request_duration_seconds",
            "Accept to last token",
            ["model"],
            buckets=_LAT,
            registry=registry,
        )
        self.tokens = Counter(
            f"{ns}_tokens",
            "Tokens by kind (prompt, completion, cached)",
            ["model", "kind"],
            registry=registry,
        )
        self.shed = Counter(f"{ns}_shed", "Requests shed with 503", ["model"], registry=registry)
        self.migrations = Counter(
            f"{ns}_migrations", "Requests moved to another worker", ["model"], registry=registry
        )
        self.route_decision = Histogram(
            f"{ns}_route_decision_seconds",
            "Time spent choosing a worker",
            ["policy"],
            buckets=(1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3),
            registry=registry,
        )
