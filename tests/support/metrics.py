"""Every series name the fleet's processes export, read from their metric classes' own
registries (one per process kind, as each process has its own), as Prometheus scrapes them: what
the shipped dashboard and rules may name."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from base.connection_metrics import ConnectionGauges
from base.consumer_metrics import ConsumerPending
from planner.connectors.base import ConnectorMetrics
from planner.service import PlannerMetrics
from router.frontend.metrics import FrontendMetrics
from router.frontend.tokenize import TokenizeMetrics
from router.indexer import IndexerMetrics
from router.service import submissions_counter
from workers.metrics import WorkerMetricFamilies, WorkerMetrics


def exported() -> set[str]:
    frontend = CollectorRegistry()
    FrontendMetrics(frontend)
    TokenizeMetrics(frontend)
    worker = CollectorRegistry()
    WorkerMetrics(WorkerMetricFamilies(worker), "m", "w")
    router = CollectorRegistry()
    submissions_counter(router)
    registries = [frontend, worker, router]
    for metrics in (IndexerMetrics, PlannerMetrics, ConnectorMetrics):
        own = CollectorRegistry()
        metrics(own)
        registries.append(own)
    plumbing = CollectorRegistry()
    ConnectionGauges(plumbing, SimpleNamespace(is_connected=True), redis=object())
    ConsumerPending(plumbing, None, "S", "c")
    registries.append(plumbing)
    names: set[str] = set()
    for registry in registries:
        for family in registry.collect():
            names |= {sample.name for sample in family.samples} | {family.name}
            if family.type == "counter":  # series that only appear once labelled
                names.add(family.name + "_total")
            if family.type == "histogram":
                names |= {family.name + s for s in ("_bucket", "_sum", "_count")}
    return names
