"""Prometheus metrics of a frontend (registry passed in, never global)."""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from router.disagg import Placement
from schemas import RouteDecision

_LAT = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_DURATION = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 3600)
_ITL = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5)
_TOKENS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)


def observe_many(histogram: Histogram) -> Callable[[float, int], None]:
    """``histogram.observe(value)`` ``n`` times in one step: the sum and one bucket updated
    once each (prometheus_client's observe takes a lock per bucket and per sum, per call: at
    one observation per streamed token, a cost per token). Through the library's own value
    objects, so multi-process mode holds too; a release without them gets the plain loop."""
    bounds: Sequence[float] | None = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None:

        def one_by_one(value: float, n: int) -> None:
            for _ in range(n):
                histogram.observe(value)

        return one_by_one

    def at_once(value: float, n: int) -> None:
        total.inc(value * n)
        buckets[bisect_left(bounds, value)].inc(n)  # the first bound >= value, as observe

    return at_once


class FrontendMetrics:
    def itl_observer(self, model: str) -> Callable[[float, int], None]:
        """``observe(gap, n)``: ``n`` inter-token gaps for ``model`` (one per model, kept)."""
        observer = self._itl_observers.get(model)
        if observer is None:
            observer = self._itl_observers[model] = observe_many(self.itl.labels(model))
        return observer

    def exposition(self) -> bytes:
        """``/metrics``: this process's metrics, or, when it is one of ``--processes N`` (which
        sets ``PROMETHEUS_MULTIPROC_DIR``), every frontend process's on this port, summed."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            merged = CollectorRegistry()
            MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
            return bytes(generate_latest(merged))
        return bytes(generate_latest(self.registry))

    def __init__(self, registry: CollectorRegistry) -> None:
        ns = "jetfleet_frontend"
        self.registry = registry
        self._itl_observers: dict[str, Callable[[float, int], None]] = {}
        self.requests = Counter(
            f"{ns}_requests",
            "Requests by endpoint and outcome: ok, error, cancelled, or the refusing HTTP status",
            ["model", "endpoint", "status"],
            registry=registry,
        )
        self.in_flight = Gauge(
            f"{ns}_in_flight",
            "Generations in progress",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.held = Gauge(
            f"{ns}_held_requests",
            "Requests held here while every worker that could serve them has a queue",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.ttft = Histogram(
            f"{ns}_time_to_first_token_seconds",
            "Accept to the first token",
            ["model"],
            buckets=(*_LAT, 60, 120, 300),
            registry=registry,
        )
        self.itl = Histogram(
            f"{ns}_inter_token_latency_seconds",
            "Time between tokens as the frontend receives them, one observation per token",
            ["model"],
            buckets=_ITL,
            registry=registry,
        )
        self.duration = Histogram(
            f"{ns}_request_duration_seconds",
            "Accept to last token",
            ["model"],
            buckets=_DURATION,
            registry=registry,
        )
        self.isl = Histogram(
            f"{ns}_input_sequence_tokens",
            "Prompt tokens per request",
            ["model"],
            buckets=_TOKENS,
            registry=registry,
        )
        self.osl = Histogram(
            f"{ns}_output_sequence_tokens",
            "Generated tokens per request",
            ["model"],
            buckets=_TOKENS,
            registry=registry,
        )
        self.tokens = Counter(
            f"{ns}_tokens",
            "Tokens by kind (prompt, completion, cached; cached_host: of cached, from a host tier)",
            ["model", "kind"],
            registry=registry,
        )
        self.shed = Counter(f"{ns}_shed", "Requests shed with 503", ["model"], registry=registry)
        self.worker_changes = Counter(
            f"{ns}_worker_changes",
            "Workers this frontend's discovery saw join or leave (a restart is both)",
            ["change"],
            registry=registry,
        )
        for change in ("joined", "left"):  # from 0, so increase() sees the first change
            self.worker_changes.labels(change)
        self.migrations = Counter(
            f"{ns}_migrations", "Requests moved to another worker", ["model"], registry=registry
        )
        self.disagg = Counter(
            f"{ns}_disagg_placements",
            "Where the prefill of a request to a disaggregated model ran, and why",
            ["model", "placement", "reason"],
            registry=registry,
        )
        self.kv_transfer = Histogram(
            f"{ns}_kv_transfer_seconds",
            "A remote prefill's KV pulled into the decode worker (as the worker reports it)",
            ["model"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=registry,
        )
        self.route_decision = Histogram(
            f"{ns}_route_decision_seconds",
            "Time spent choosing a worker",
            ["policy"],
            buckets=(
                1e-5,
                2.5e-5,
                5e-5,
                1e-4,
                2.5e-4,
                5e-4,
                1e-3,
                2.5e-3,
                5e-3,
                0.01,
                0.025,
                0.05,
                0.1,
                0.25,
            ),
            registry=registry,
        )
        self.route_overlap = Histogram(
            f"{ns}_route_overlap_blocks",
            "Cached prompt blocks on the chosen worker",
            ["policy"],
            buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=registry,
        )
        self.route_hit_rate = Histogram(
            f"{ns}_route_predicted_hit_rate",
            "Predicted share of prompt blocks cached",
            ["policy"],
            buckets=(0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0),
            registry=registry,
        )

    def count_worker_change(self, _worker_id: str, change: str) -> None:
        self.worker_changes.labels(change).inc()

    def count_placement(self, model: str, placement: Placement) -> None:
        where = "remote" if placement.remote else "local"
        self.disagg.labels(model, where, placement.reason).inc()

    def observe_route(self, decision: RouteDecision, prompt_tokens: int, block_size: int) -> None:
        self.route_decision.labels(decision.policy).observe(decision.decision_us / 1e6)
        won = next((c for c in decision.candidates if c.worker_id == decision.worker_id), None)
        if won is not None:
            self.route_overlap.labels(decision.policy).observe(won.overlap_blocks)
            if prompt_tokens:
                hit = min(won.overlap_blocks * block_size / prompt_tokens, 1.0)
                self.route_hit_rate.labels(decision.policy).observe(hit)
