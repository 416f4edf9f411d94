"""The fsync policy the fleet ships (docs/operating/reliability-multihost.md): JetStream writes
on disk before they are acknowledged, on the embedded server of ``jetfleet up`` and ``jetfleet
servers`` and in the Helm chart's bundled NATS; ``--nats-sync-interval`` (and the chart's
``nats.jetstream.syncInterval``) choose otherwise."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from infra.cli import build_parser
from infra.devtools import tool

CHART = Path(__file__).resolve().parents[2] / "infra" / "deploy" / "helm" / "jetfleet"


@pytest.mark.parametrize("command", ["up", "servers"])
def test_the_embedded_server_syncs_every_write_unless_told_otherwise(command: str) -> None:
    parser = build_parser()
    assert parser.parse_args([command]).nats_sync_interval == "always"
    assert parser.parse_args([command, "--nats-sync-interval", "2m"]).nats_sync_interval == "2m"


def test_the_charts_nats_config_syncs_every_write() -> None:
    helm = tool("helm")
    if helm is None:
        pytest.fail("helm is not installed: run `python -m infra.devtools`")
    rendered = subprocess.run(
        [str(helm), "template", "jetfleet", str(CHART), "--show-only", "templates/nats.yaml"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    conf = next(
        doc["data"]["nats.conf"]
        for doc in yaml.safe_load_all(rendered)
        if doc and doc.get("kind") == "ConfigMap"
    )
    block = re.search(r"jetstream \{(.*?)\n\s*\}", conf, re.S)
    assert block is not None
    assert re.search(r"^\s*sync_interval: always\s*$", block.group(1), re.M), block.group(1)
