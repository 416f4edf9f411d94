"""The shipped Grafana dashboard and Prometheus config name only metrics the processes export."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from planner.service import PlannerMetrics
from router.frontend.metrics import FrontendMetrics
from router.frontend.tokenize import TokenizeMetrics
from router.indexer import IndexerMetrics
from router.service import submissions_counter
from workers.metrics import WorkerMetricFamilies, WorkerMetrics

DEPLOY = Path(__file__).resolve().parents[2] / "infra" / "deploy"


def exported() -> set[str]:
    registry = CollectorRegistry()
    FrontendMetrics(registry)
    TokenizeMetrics(registry)
    WorkerMetrics(WorkerMetricFamilies(registry), "m", "w")
    IndexerMetrics(registry)
    PlannerMetrics(registry)
    submissions_counter(registry)
    names = set()
    for family in registry.collect():
        names |= {sample.name for sample in family.samples} | {family.name}
    for family in registry.collect():  # series that only appear once labelled
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_sum", "_count")}
    return names


def test_every_dashboard_query_names_an_exported_metric() -> None:
    dash = json.loads((DEPLOY / "grafana" / "jetfleet-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bjetfleet_[a-z_]+", e)}
    assert used and used <= exported(), used - exported()


def test_the_scrape_config_finds_every_process_through_the_fleet() -> None:
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    (static,) = jobs["jetfleet-frontend"]["static_configs"]
    assert static["targets"] == ["127.0.0.1:8000"]  # jetfleet up's default port
    (sd,) = jobs["jetfleet"]["http_sd_configs"]
    assert sd["url"] == "http://127.0.0.1:8000/discovery/prometheus"
