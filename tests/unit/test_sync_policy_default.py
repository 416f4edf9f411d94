"""The fsync policy the fleet ships (docs/operating/reliability-multihost.md): JetStream writes
on disk before they are acknowledged, on the embedded server of ``jetfleet up`` and ``jetfleet
servers`` and in the Kubernetes NATS config; ``--nats-sync-interval`` chooses otherwise."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from infra.cli import build_parser

K8S_NATS = Path(__file__).resolve().parents[2] / "infra" / "deploy" / "k8s" / "nats.yaml"


@pytest.mark.parametrize("command", ["up", "servers"])
def test_the_embedded_server_syncs_every_write_unless_told_otherwise(command: str) -> None:
    parser = build_parser()
    assert parser.parse_args([command]).nats_sync_interval == "always"
    assert parser.parse_args([command, "--nats-sync-interval", "2m"]).nats_sync_interval == "2m"


def test_the_kubernetes_nats_config_syncs_every_write() -> None:
    conf = next(
        doc["data"]["nats.conf"]
        for doc in yaml.safe_load_all(K8S_NATS.read_text())
        if doc and doc.get("kind") == "ConfigMap"
    )
    block = re.search(r"jetstream \{(.*?)\n\s*\}", conf, re.S)
    assert block is not None
    assert re.search(r"^\s*sync_interval: always\s*$", block.group(1), re.M), block.group(1)
