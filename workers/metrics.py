"""Prometheus metrics of a worker (registry passed in, never global)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from workers.engine import EngineLoad
from workers.request_state import ActiveRequest


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry, model: str, worker_id: str) -> None:
        labels = {"model": model, "worker_id": worker_id}
        ns = "jetfleet_worker"
        self.registry = registry
        self.requests_started = Counter(
            f"{ns}_requests_started", "Requests admitted", list(labels), registry=registry
        ).labels(**labels)
        self._finished = Counter(
            f"{ns}_requests_finished",
            "Requests ended, by finish reason",
            [*labels, "finish_reason"],
            registry=registry,
        )
        self._tokens = Counter(
            f"{ns}_tokens", "Tokens processed", [*labels, "kind"], registry=registry
        )
        self._duration = Histogram(
            f"{ns}_request_duration_seconds",
            "Admission to last token",
            list(labels),
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 3600),
            registry=registry,
        ).labels(**labels)

        def gauge(name: str, doc: str) -> Gauge:
            g = Gauge(f"{ns}_{name}", doc, list(labels), registry=registry)
            return g.labels(**labels)

        self._running = gauge("num_running", "Sequences in the running batch")
        self._waiting = gauge("num_waiting", "Sequences waiting (incl. preempted)")
        self._kv_usage = gauge("kv_usage", "Fraction of KV blocks in use")
        self._host_kv_usage = gauge(
            "host_kv_usage", "Fraction of the host-memory KV tier's blocks holding cached KV"
        )

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"{ns}_{name}", doc, list(labels), registry=registry).labels(**labels)

        # counters, as vLLM's: they sum over workers and rate() over time (a ratio gauge does not)
        self._preemptions = counter("num_preemptions", "Sequences preempted (KV cache full)")
        self._cache_queries = counter("prefix_cache_queries", "Prompt tokens looked up")
        self._cache_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache")
        self._seen = (0, 0, 0)  # the engine's totals at the last load report
        self._labels = labels

    def observe_finished(self, ar: ActiveRequest, now: float) -> None:
        reason = ar.finish_reason or ("error" if ar.error else "stop")
        self._finished.labels(**self._labels, finish_reason=reason).inc()
        self._tokens.labels(**self._labels, kind="prompt").inc(ar.prompt_tokens)
        self._tokens.labels(**self._labels, kind="cached").inc(ar.cached_tokens)
        if ar.host_cached_tokens:
            self._tokens.labels(**self._labels, kind="cached_host").inc(ar.host_cached_tokens)
        self._tokens.labels(**self._labels, kind="generated").inc(ar.num_generated)
        self._duration.observe(now - ar.started_at)

    def observe_load(self, load: EngineLoad) -> None:
        self._running.set(load.num_running)
        self._waiting.set(load.num_waiting)
        self._kv_usage.set(load.kv_usage)
        if load.num_cpu_blocks:
            self._host_kv_usage.set(load.num_host_blocks / load.num_cpu_blocks)
        now = (load.num_preempted_total, load.prompt_tokens_total, load.cached_tokens_total)
        for counter, new, old in zip(
            (self._preemptions, self._cache_queries, self._cache_hits), now, self._seen, strict=True
        ):
            if new > old:
                counter.inc(new - old)
        self._seen = now
