"""Prometheus metrics of a worker (registry passed in, never global).

The families (``WorkerMetricFamilies``) are declared once per registry, labelled by model and
worker id; each worker observes through its own ``WorkerMetrics``, so a process running several
workers (``jetfleet worker --replicas N``) serves all of them on its one ``/metrics``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from base.deadletter import DeadLetterMetrics
from workers.engine import EngineLoad
from workers.request_state import ActiveRequest

_NS = "jetfleet_worker"
_LABELS = ("model", "worker_id")
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 3600)


class WorkerMetricFamilies:
    """Every worker metric of one registry, unlabelled."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        labels = list(_LABELS)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(f"{_NS}_{name}", doc, [*labels, *extra], registry=registry)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"{_NS}_{name}", doc, labels, registry=registry)

        self.requests_started = counter("requests_started", "Requests admitted")
        self.finished = counter(
            "requests_finished", "Requests ended, by finish reason", ("finish_reason",)
        )
        self.tokens = counter("tokens", "Tokens processed", ("kind",))
        self.duration = Histogram(
            f"{_NS}_request_duration_seconds",
            "Admission to last token",
            labels,
            buckets=_DURATION_BUCKETS,
            registry=registry,
        )
        self.running = gauge("num_running", "Sequences in the running batch")
        self.waiting = gauge("num_waiting", "Sequences waiting (incl. preempted)")
        self.kv_usage = gauge("kv_usage", "Fraction of KV blocks in use")
        self.host_kv_usage = gauge(
            "host_kv_usage", "Fraction of the host-memory KV tier's blocks holding cached KV"
        )
        # counters, as vLLM's: they sum over workers and rate() over time (a ratio gauge does not)
        self.preemptions = counter("num_preemptions", "Sequences preempted (KV cache full)")
        self.cache_queries = counter("prefix_cache_queries", "Prompt tokens looked up")
        self.cache_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache")
        self.dead_letters = DeadLetterMetrics(registry)  # jetfleet_dead_letters_total


class WorkerMetrics:
    """One worker's view of the families (its labels bound)."""

    def __init__(self, families: WorkerMetricFamilies, model: str, worker_id: str) -> None:
        fam = families
        labels = {"model": model, "worker_id": worker_id}
        self.registry = fam.registry
        self.dead_letters = fam.dead_letters
        self.requests_started = fam.requests_started.labels(**labels)
        self._finished = fam.finished
        self._tokens = fam.tokens
        self._duration = fam.duration.labels(**labels)
        self._running = fam.running.labels(**labels)
        self._waiting = fam.waiting.labels(**labels)
        self._kv_usage = fam.kv_usage.labels(**labels)
        self._host_kv_usage = fam.host_kv_usage.labels(**labels)
        self._preemptions = fam.preemptions.labels(**labels)
        self._cache_queries = fam.cache_queries.labels(**labels)
        self._cache_hits = fam.cache_hits.labels(**labels)
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
