"""infra/deploy/k8s: every manifest is valid Kubernetes (kubernetes-validate, strict, against the
API's own schemas), every jetfleet container's arguments parse with the jetfleet CLI, images are
pinned with a pull policy, processes run as non-root, probes are where they belong."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from infra.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "deploy" / "k8s"
KUBERNETES_VERSION = "1.31"
CRD_GROUPS = ("monitoring.coreos.com/",)


def documents() -> list[tuple[str, dict[str, Any]]]:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return [
        (name, doc)
        for name in kust["resources"]
        for doc in yaml.safe_load_all((K8S / name).read_text())
        if doc
    ]


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {})
    pod = spec.get("template", {}).get("spec") or spec.get("jobTemplate", {}).get("spec", {})
    return list(pod.get("containers", [])) if isinstance(pod, dict) else []


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    return dict(doc.get("spec", {}).get("template", {}).get("spec", {}))


def test_the_kustomization_lists_every_manifest() -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files


@pytest.mark.parametrize(
    ("name", "doc"), documents(), ids=lambda x: x if isinstance(x, str) else ""
)
def test_each_manifest_is_valid_kubernetes(name: str, doc: dict[str, Any]) -> None:
    if doc["apiVersion"].startswith(CRD_GROUPS):  # the operator's CRDs: no schema to check here
        assert doc["kind"] in ("ServiceMonitor", "PodMonitor")
        return
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_every_jetfleet_container_runs_a_real_command_safely() -> None:
    parser = build_parser()
    seen = 0
    for _name, doc in documents():
        pod = pod_spec(doc)
        for c in containers(doc):
            if not c["image"].startswith("jetfleet:"):
                assert ":" in c["image"] and not c["image"].endswith(":latest")
                continue
            seen += 1
            assert re.fullmatch(r"jetfleet:\d+\.\d+\.\d+", c["image"]), c["image"]
            assert c.get("imagePullPolicy") == "IfNotPresent"
            non_root = pod.get("securityContext", {}).get("runAsNonRoot") or c.get(
                "securityContext", {}
            ).get("runAsNonRoot")
            assert non_root, f"{doc['metadata']['name']} runs as root"
            args = [a.replace("$(POD_NAME)", "pod-1") for a in c["args"]]
            parser.parse_args(args)  # SystemExit if a flag does not exist
    assert seen >= 8


def test_probes_where_they_belong() -> None:
    by_name = {
        doc["metadata"]["name"]: doc
        for _, doc in documents()
        if doc["kind"] in ("Deployment", "StatefulSet")
    }
    for name in ("jetfleet-frontend", "jetfleet-indexer", "jetfleet-planner", "jetfleet-router"):
        (c,) = containers(by_name[name])
        assert c["readinessProbe"] and c["livenessProbe"], name
    for role in ("agg", "prefill", "decode"):
        (c,) = containers(by_name[f"jetfleet-{role}"])
        assert c["readinessProbe"] and c["startupProbe"], role  # slow vLLM loads
    (nats,) = containers(by_name["nats"])
    assert by_name["nats"]["spec"]["replicas"] == 3 and nats["readinessProbe"]


def test_services_select_pods_that_exist() -> None:
    pod_labels = [
        doc["spec"]["template"]["metadata"]["labels"]
        for _, doc in documents()
        if doc["kind"] in ("Deployment", "StatefulSet")
    ]
    for _, doc in documents():
        if doc["kind"] == "Service":
            sel = doc["spec"]["selector"]
            assert any(sel.items() <= labels.items() for labels in pod_labels), doc["metadata"]


def test_the_image_holds_every_package_and_runs_as_non_root() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert packages and all(f"COPY {p} {p}" in dockerfile for p in packages)
    users = re.findall(r"^USER (\S+)", dockerfile, re.M)
    assert users and users[-1] not in ("root", "0")


def test_redis_has_a_replica_and_sentinels_the_fleet_finds_it_through() -> None:
    """Two Redis pods, three sentinels with a quorum of two, and the fleet's Redis URL names
    the sentinels' Service and the monitored service; the start scripts are valid sh."""
    import subprocess

    from base.connect import parse_sentinel_url

    docs = {(d["kind"], d["metadata"]["name"]): d for _, d in documents()}
    assert docs[("StatefulSet", "redis")]["spec"]["replicas"] == 2
    assert docs[("StatefulSet", "redis-sentinel")]["spec"]["replicas"] == 3
    url = docs[("ConfigMap", "jetfleet-env")]["data"]["JETFLEET_REDIS_URL"]
    parsed = parse_sentinel_url(url)
    [(host, port)] = parsed.sentinels
    sentinel_svc = docs[("Service", host)]
    assert port in [p["port"] for p in sentinel_svc["spec"]["ports"]]
    scripts = docs[("ConfigMap", "redis-ha")]["data"]
    assert f"sentinel monitor {parsed.service} " in scripts["start-sentinel.sh"]
    assert " 2\n" in scripts["start-sentinel.sh"].split("sentinel monitor")[1]  # quorum
    assert f"get-master-addr-by-name {parsed.service}" in scripts["start-redis.sh"]
    for name, text in scripts.items():
        checked = subprocess.run(["sh", "-n"], input=text, text=True, capture_output=True)
        assert checked.returncode == 0, (name, checked.stderr)
