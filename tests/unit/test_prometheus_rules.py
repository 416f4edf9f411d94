"""The shipped Prometheus rules (infra/deploy/prometheus/jetfleet-rules.yml): promtool accepts them
and their unit tests pass, every alert says how bad it is and where its runbook is, and every
metric they read is one the processes export (read from the metric classes' registries)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.devtools import tool
from tests.support.metrics import exported

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "infra" / "deploy" / "prometheus" / "jetfleet-rules.yml"
RULE_TESTS = RULES.with_name("jetfleet-rules.test.yml")
RUNBOOK = ROOT / "docs" / "operating" / "alerts.md"


def promtool() -> Path:
    found = tool("promtool")
    if found is None:
        pytest.fail("promtool is not installed: run `python -m infra.devtools` (see the README)")
    return found


def run_promtool(*args: str) -> None:
    done = subprocess.run(
        [str(promtool()), *args], capture_output=True, text=True, cwd=RULES.parent
    )
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}\n{done.stderr}"


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def test_promtool_accepts_the_rules() -> None:
    run_promtool("check", "rules", RULES.name)


def test_promtool_accepts_the_shipped_config_and_the_rules_it_loads() -> None:
    run_promtool("check", "config", "prometheus.yml")


def test_the_rules_unit_tests_pass() -> None:
    run_promtool("test", "rules", RULE_TESTS.name)


def test_every_alert_has_a_unit_test() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    tested = {case["alertname"] for t in tests for case in t.get("alert_rule_test", [])}
    firing = {
        case["alertname"]
        for t in tests
        for case in t.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    names = {a["alert"] for a in alerts()}
    assert names == tested == firing


def test_every_alert_says_how_bad_it_is_and_where_its_runbook_is() -> None:
    anchors = {
        m.group(1).lower()
        for m in re.finditer(r"^#+\s+(\S+)\s*$", RUNBOOK.read_text(), re.MULTILINE)
    }
    assert alerts()
    for alert in alerts():
        name = alert["alert"]
        assert alert["labels"]["severity"] in ("page", "ticket"), name
        notes = alert["annotations"]
        assert notes["summary"] and notes["description"], name
        assert notes["runbook_url"] == f"docs/operating/alerts.md#{name.lower()}", name
        assert name.lower() in anchors, f"{name}: no section in {RUNBOOK.name}"


def test_every_metric_the_rules_read_is_exported() -> None:
    used = {m for rule in rules() for m in re.findall(r"\bjetfleet_[a-z_]+", rule["expr"])}
    assert used and used <= exported(), sorted(used - exported())
