"""A real Prometheus (Debian's 2.42, installed by the test command: ``infra.devtools``) beside
``jetfleet up`` as the README starts it, with the shipped ``prometheus.yml`` and rules: every
component is scraped ``up``, every rule loads and evaluates without error, and every dashboard
query evaluates without error (the request-rate panel with data)."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from base.ports import free_port
from infra.devtools import tool
from tests.support.clients import openai_client
from tests.support.up import running_up
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "infra" / "deploy"
SHIPPED = DEPLOY / "prometheus"
COMPONENTS = {"frontend", "router", "indexer", "planner", "connector", "worker"}
GRAFANA_VARIABLES = {"$model": ".*", "$__rate_interval": "1m"}  # what Grafana substitutes


def prometheus_config(port: int, work: Path) -> Path:
    """The shipped config and rules, for this fleet's port (not up's default 8000, which a
    parallel test may hold) and scraped every second (so the test waits seconds, not minutes):
    nothing else changed."""
    text = (SHIPPED / "prometheus.yml").read_text().replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    cfg = yaml.safe_load(text)
    cfg["global"].update(scrape_interval="1s", evaluation_interval="1s")
    for job in cfg["scrape_configs"]:
        for sd in job.get("http_sd_configs", []):
            sd["refresh_interval"] = "1s"
    for rules in cfg.get("rule_files", []):
        shutil.copy(SHIPPED / rules, work / rules)
    path = work / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def api(base: str, path: str, **params: str) -> Any:
    url = f"{base}/api/v1/{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]


def query(base: str, expr: str) -> list[Any]:
    """An instant query; raises (with Prometheus' error) unless it evaluates."""
    try:
        return list(api(base, "query", query=expr)["result"])
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{expr}: {exc.read().decode()}") from exc


def dashboard_queries() -> list[str]:
    dash = json.loads((DEPLOY / "grafana" / "jetfleet-dashboard.json").read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            out.append(expr)
    return out


def rule_queries() -> list[str]:
    rules = yaml.safe_load((SHIPPED / "jetfleet-rules.yml").read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def test_a_real_prometheus_scrapes_every_component_of_up(tmp_path: Path) -> None:
    prometheus = tool("prometheus")
    assert prometheus, "no prometheus: bash infra/bootstrap.sh test installs it (infra.devtools)"
    with running_up(tmp_path, 2, "--speedup", "20", planner=True) as fleet:
        port = int(fleet.base_url.rsplit(":", 1)[1])
        config = prometheus_config(port, tmp_path)
        web = f"127.0.0.1:{free_port()}"
        argv = [
            str(prometheus),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address={web}",
        ]
        log = (tmp_path / "prometheus.log").open("wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://{web}"
        try:
            client = openai_client(fleet.base_url, api_key="none", max_retries=2)
            for i in range(4):  # samples for the latency histograms
                client.chat.completions.create(
                    model="jetfleet-tiny",
                    messages=[{"role": "user", "content": f"hello {i}"}],
                    max_tokens=8,
                )

            def all_up() -> list[dict[str, Any]] | None:
                try:
                    targets: list[dict[str, Any]] = api(base, "targets")["activeTargets"]
                except OSError:  # Prometheus still starting
                    return None
                components = {t["labels"].get("component") for t in targets}
                healthy = all(t["health"] == "up" for t in targets)
                return targets if components == COMPONENTS and healthy else None

            targets = wait_until(all_up, 60, "every component scraped up", 0.5)
            workers = [t for t in targets if t["labels"]["component"] == "worker"]
            assert len(workers) >= 2, targets

            def rules_evaluated() -> list[dict[str, Any]] | None:
                groups = api(base, "rules")["groups"]
                rules = [r for g in groups for r in g["rules"]]
                return rules if rules and all(r["health"] == "ok" for r in rules) else None

            def failing() -> list[Any]:
                groups = api(base, "rules")["groups"]
                return [(r["name"], r.get("lastError")) for g in groups for r in g["rules"]]

            try:
                rules = wait_until(rules_evaluated, 30, "every rule evaluated", 0.5)
            except AssertionError as exc:
                raise AssertionError(f"rules not all healthy: {failing()}") from exc
            assert len(rules) == len(rule_queries())
            for expr in rule_queries():
                query(base, expr)

            def requests_seen() -> list[Any] | None:
                return query(base, dashboard_queries()[0]) or None

            wait_until(requests_seen, 30, "the request-rate panel has data", 0.5)
            for expr in dashboard_queries():
                query(base, expr)
        finally:
            proc.terminate()
            proc.wait(30)
            log.close()
