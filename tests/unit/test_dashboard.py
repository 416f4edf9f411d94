"""The shipped Grafana dashboard and Prometheus config name only metrics the processes export."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tests.support.metrics import exported

DEPLOY = Path(__file__).resolve().parents[2] / "infra" / "deploy"


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
