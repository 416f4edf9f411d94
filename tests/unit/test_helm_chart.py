"""infra/deploy/helm/jetfleet, rendered by the real helm for every values file of the matrix
(infra/deploy/helm/ci): `helm lint --strict` passes; every object is valid Kubernetes (strict
kubernetes-validate against the oldest version the chart claims and the newest the validator
knows; the Prometheus Operator's objects, which have no schema there, checked by structure);
every jetfleet container's arguments parse with the jetfleet CLI; images are pinned with a pull
policy; pods run restricted (non-root, read-only root, no capabilities, seccomp); probes are on
the `ops` port where they belong; workloads have their disruption budgets and resources; the
connector's Role grants exactly what it calls; Services and monitors select pods that exist.

Each matrix file is rendered once per session (helm template takes ~50 ms). No cluster: what
a cluster would do with the objects is not checked here.
"""

from __future__ import annotations

import functools
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml
from kubernetes_validate.utils import all_versions, latest_version

from infra.cli import build_parser
from infra.cli.connectors import config_from_args
from infra.devtools import tool

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "infra" / "deploy" / "helm" / "jetfleet"
CI = ROOT / "infra" / "deploy" / "helm" / "ci"
RULES = ROOT / "infra" / "deploy" / "prometheus" / "jetfleet-rules.yml"
DASHBOARD = ROOT / "infra" / "deploy" / "grafana" / "jetfleet-dashboard.json"
MATRIX = sorted(p.name for p in CI.glob("*.yaml"))
RELEASE, NAMESPACE = "jetfleet", "jetfleet"
CRD_GROUP = "monitoring.coreos.com/"
CRD_REQUIRED = {
    "ServiceMonitor": ("selector", "endpoints"),
    "PodMonitor": ("selector", "podMetricsEndpoints"),
    "PrometheusRule": ("groups",),
}
WORKLOADS = ("Deployment", "StatefulSet")
COMPONENT = "app.kubernetes.io/component"
Doc = dict[str, Any]


# --- rendering --------------------------------------------------------------------------------


def helm() -> Path:
    found = tool("helm")
    if found is None:
        pytest.fail(
            "helm is not installed: run `python -m infra.devtools` (the README's test command)"
        )
    return found


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm()), *args], capture_output=True, text=True, timeout=60)


def kube_versions() -> tuple[str, str]:
    """The oldest Kubernetes the chart claims (Chart.yaml's kubeVersion) and the newest the
    validator has schemas for."""
    claim = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    found = re.fullmatch(r">=\s*(\d+\.\d+)\.\d+(-0)?", claim)
    assert found, f"kubeVersion {claim!r}: expected '>=X.Y.Z-0'"
    oldest = found.group(1) + ".0"
    assert oldest in all_versions(), f"kubernetes-validate has no schemas for {oldest}"
    return oldest, latest_version()


@functools.cache
def render(values_file: str, *sets: str) -> tuple[Doc, ...]:
    args = ["template", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(CI / values_file)]
    args += ["--kube-version", kube_versions()[0]]
    for item in sets:
        args += ["--set", item]
    done = run_helm(*args)
    assert done.returncode == 0, done.stderr
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def deep_merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        return {k: deep_merge(base[k], v) if k in base else v for k, v in over.items()} | {
            k: v for k, v in base.items() if k not in over
        }
    return over


@functools.cache
def chart_values(values_file: str) -> Doc:
    """The chart's values with the matrix file's over them (as helm merges them)."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    merged: Doc = deep_merge(defaults, yaml.safe_load((CI / values_file).read_text()) or {})
    return merged


def pools(values_file: str) -> list[Doc]:
    workers = chart_values(values_file)["workers"]
    return [deep_merge(workers["poolDefaults"], pool) for pool in workers["pools"]]


def of_kind(docs: tuple[Doc, ...], *kinds: str) -> list[Doc]:
    return [d for d in docs if d["kind"] in kinds]


def by_name(docs: tuple[Doc, ...], kind: str) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in of_kind(docs, kind)}


def pod_spec(doc: Doc) -> Doc:
    spec: Doc = doc["spec"]["template"]["spec"]
    return spec


def pod_labels(doc: Doc) -> dict[str, str]:
    labels: dict[str, str] = doc["spec"]["template"]["metadata"]["labels"]
    return labels


def with_pods(docs: tuple[Doc, ...]) -> list[Doc]:
    return of_kind(docs, "Deployment", "StatefulSet", "Job")


def containers(docs: tuple[Doc, ...]) -> Iterator[tuple[Doc, Doc]]:
    for doc in with_pods(docs):
        for c in pod_spec(doc)["containers"]:
            yield doc, c


def is_jetfleet(c: Doc) -> bool:
    return bool(c.get("command") == ["jetfleet"])


def env_of(c: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in c.get("env", [])}


def selects(selector: Doc, labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels, matchExpressions with In) against a pod's labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In", expr
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def arg_after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


each_values_file = pytest.mark.parametrize("values_file", MATRIX)


# --- the chart itself -------------------------------------------------------------------------


def test_the_matrix_is_complete() -> None:
    assert set(MATRIX) == {
        "mocker.yaml",
        "vllm-aggregated.yaml",
        "disaggregated.yaml",
        "external.yaml",
        "sentinel.yaml",
        "monitoring.yaml",
    }


def test_chart_metadata_and_the_files_it_links() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["appVersion"] == "0.1.0"
    kube_versions()  # a kubeVersion claim the validator can check
    for link, target in (("jetfleet-rules.yml", RULES), ("jetfleet-dashboard.json", DASHBOARD)):
        path = CHART / "files" / link
        assert path.is_symlink(), f"{path} must link to {target}: one source of truth"
        assert path.resolve() == target.resolve() and target.is_file()
    for name in ("_helpers.tpl", "NOTES.txt"):
        assert (CHART / "templates" / name).is_file()


def test_every_value_is_documented() -> None:
    """helm-docs style: every value (a leaf, or a key whose value is written inline) has a
    `# --` comment above it or above a map that holds it."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, bool]] = []  # (indent, documented) of the open maps
    undocumented = []
    for i, line in enumerate(lines):
        key = re.match(r"^(\s*)([A-Za-z_][\w.-]*):(.*)$", line)
        if not key or line.lstrip().startswith("#"):
            continue
        indent, name, rest = len(key.group(1)), key.group(2), key.group(3).strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        j = i - 1
        while (
            j >= 0 and lines[j].strip().startswith("#") and not lines[j].strip().startswith("# --")
        ):
            j -= 1
        documented = j >= 0 and lines[j].strip().startswith("# --")
        covered = documented or any(doc for _, doc in stack)
        if rest and not rest.startswith("#") and not covered:
            undocumented.append(f"line {i + 1}: {name}")
        stack.append((indent, covered))
    assert not undocumented, undocumented


@each_values_file
def test_lint_strict(values_file: str) -> None:
    done = run_helm("lint", "--strict", str(CHART), "-f", str(CI / values_file))
    assert done.returncode == 0, done.stdout + done.stderr


# --- valid Kubernetes ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def schemas_read_once() -> Iterator[None]:
    """kubernetes-validate reads its schema files (the definitions: megabytes of JSON) on every
    call; read each once (the validator does not change them)."""
    with pytest.MonkeyPatch.context() as mp:
        cached = functools.cache(kubernetes_validate.utils.schema_contents)
        mp.setattr(kubernetes_validate.utils, "schema_contents", cached)
        yield


@each_values_file
@pytest.mark.usefixtures("schemas_read_once")
def test_every_object_is_valid_kubernetes(values_file: str) -> None:
    docs = render(values_file)
    assert docs
    for doc in docs:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        assert doc["metadata"].get("namespace") == NAMESPACE, name
        if doc["apiVersion"].startswith(CRD_GROUP):  # the operator's CRDs: no schema here
            required = CRD_REQUIRED[doc["kind"]]
            assert doc["apiVersion"] == CRD_GROUP + "v1", name
            assert all(doc["spec"].get(field) for field in required), name
            continue
        for version in kube_versions():
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{values_file}: {name} is not valid Kubernetes {version}: {exc}")


@each_values_file
def test_every_object_carries_the_standard_labels(values_file: str) -> None:
    for doc in render(values_file):
        labels = doc["metadata"].get("labels", {})
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "helm.sh/chart"):
            assert key in labels, (doc["kind"], doc["metadata"]["name"], key)
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


# --- containers ---------------------------------------------------------------------------------


@each_values_file
def test_every_jetfleet_container_runs_a_real_command_safely(values_file: str) -> None:
    parser = build_parser()
    seen = 0
    for doc, c in containers(render(values_file)):
        name = f"{doc['metadata']['name']}/{c['name']}"
        pod = pod_spec(doc)
        assert re.fullmatch(r"[\w./-]+(:\d+)?[\w./-]*:[\w.-]+", c["image"]), name
        assert not c["image"].endswith(":latest"), name
        assert c["imagePullPolicy"] == "IfNotPresent", name
        # restricted: non-root, no escalation, no capabilities, RuntimeDefault seccomp
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] > 0, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, name
        assert sc["capabilities"] == {"drop": ["ALL"]}, name
        assert sc["readOnlyRootFilesystem"] is True, name
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], name
        if not is_jetfleet(c):
            continue
        seen += 1
        assert re.fullmatch(r"[\w./-]*jetfleet[\w-]*:\d+\.\d+\.\d+", c["image"]), name
        assert pod["securityContext"]["runAsUser"] == 10001, name  # the Dockerfile's user
        assert "/tmp" in [m["mountPath"] for m in c["volumeMounts"]], name  # read-only root
        args = [a.replace("$(POD_NAME)", "pod-1") for a in c["args"]]
        try:
            parser.parse_args(args)
        except SystemExit:
            pytest.fail(f"{values_file}: {name}: `jetfleet {' '.join(args)}` does not parse")
    assert seen >= 6


def test_the_image_holds_every_package_and_runs_as_the_charts_user() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert packages and all(f"COPY {p} {p}" in dockerfile for p in packages)
    users = re.findall(r"^USER (\S+)", dockerfile, re.M)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert users and users[-1] == str(values["podSecurityContext"]["runAsUser"])


@each_values_file
def test_probes_where_they_belong(values_file: str) -> None:
    """Every jetfleet process with an operations port serves it on 0.0.0.0 as the container port
    `ops`, ready on /ready; services are live on /health; workers have a startup probe on
    /health (slow vLLM loads) and no liveness probe by default (a draining worker answers 503)."""
    docs = render(values_file)
    with_ops = set()
    for doc, c in containers(docs):
        if not is_jetfleet(c) or doc["kind"] == "Job":
            continue
        component = pod_labels(doc)[COMPONENT]
        with_ops.add(component)
        (port,) = c["ports"]
        assert port["name"] == "ops", component
        if component == "frontend":
            assert arg_after(c["args"], "--port") == str(port["containerPort"])
            assert arg_after(c["args"], "--host") == "0.0.0.0"
        else:
            assert arg_after(c["args"], "--metrics-port") == str(port["containerPort"])
            assert arg_after(c["args"], "--metrics-host") == "0.0.0.0"
        ready = c["readinessProbe"]["httpGet"]
        assert ready == {"path": "/ready", "port": "ops"}, component
        if component == "worker":
            assert c["startupProbe"]["httpGet"] == {"path": "/health", "port": "ops"}
            assert "livenessProbe" not in c
        else:
            assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "ops"}, component
    assert {"frontend", "indexer", "planner", "router", "worker", "connector"} <= with_ops
    for sts in of_kind(docs, "StatefulSet"):
        for c in pod_spec(sts)["containers"]:
            assert c["readinessProbe"] and c["livenessProbe"], sts["metadata"]["name"]


@each_values_file
def test_termination_drains(values_file: str) -> None:
    """A worker drains on SIGTERM (workers/runtime.py) within --drain-timeout: its grace period
    leaves room for it. A frontend pauses before SIGTERM, then uvicorn stops gracefully (30 s)."""
    docs = render(values_file)
    for doc, c in containers(docs):
        component = pod_labels(doc).get(COMPONENT)
        grace = pod_spec(doc).get("terminationGracePeriodSeconds", 30)
        if component == "worker":
            assert grace > float(arg_after(c["args"], "--drain-timeout")), doc["metadata"]["name"]
        if component == "frontend":
            pause = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
            assert grace >= pause + 30


# --- workloads ----------------------------------------------------------------------------------


def pdb_expected(values_file: str, doc: Doc) -> bool:
    values = chart_values(values_file)
    component = pod_labels(doc)[COMPONENT]
    if component == "worker":
        (pool,) = [
            p for p in pools(values_file) if p["name"] == pod_labels(doc)["jetfleet.io/pool"]
        ]
        return bool(pool["pdb"]["enabled"])
    where = {
        "frontend": values["frontend"],
        "router": values["router"],
        "indexer": values["indexer"],
        "nats": values["nats"],
        "redis": values["redis"] if values["redis"]["sentinel"]["enabled"] else {},
        "redis-sentinel": values["redis"]["sentinel"],
    }.get(component, {})
    return bool(where.get("pdb", {}).get("enabled"))


@each_values_file
def test_workloads_have_their_disruption_budgets(values_file: str) -> None:
    docs = render(values_file)
    pdbs = of_kind(docs, "PodDisruptionBudget")
    workloads = of_kind(docs, *WORKLOADS)
    for doc in workloads:
        covering = [p for p in pdbs if selects(p["spec"]["selector"], pod_labels(doc))]
        assert len(covering) == int(pdb_expected(values_file, doc)), doc["metadata"]["name"]
    for pdb in pdbs:  # each selects the pods of exactly one workload
        owners = [w for w in workloads if selects(pdb["spec"]["selector"], pod_labels(w))]
        assert len(owners) == 1, pdb["metadata"]["name"]
    components = {pod_labels(d)[COMPONENT] for d in workloads if pdb_expected(values_file, d)}
    assert {"frontend", "indexer", "worker"} <= components
    assert "router" in components or not chart_values(values_file)["router"]["enabled"]


@each_values_file
def test_services_select_pods_that_exist(values_file: str) -> None:
    docs = render(values_file)
    pods = [pod_labels(d) for d in of_kind(docs, *WORKLOADS)]
    for svc in of_kind(docs, "Service"):
        assert any(svc["spec"]["selector"].items() <= p.items() for p in pods), svc["metadata"]


@each_values_file
def test_the_connector_may_scale_the_pools_and_nothing_else(values_file: str) -> None:
    docs = render(values_file)
    workers = {
        d["metadata"]["name"]: pod_labels(d)["jetfleet.io/role"]
        for d in of_kind(docs, "Deployment")
        if pod_labels(d)[COMPONENT] == "worker"
    }
    (connector,) = [
        d for d in of_kind(docs, "Deployment") if pod_labels(d)[COMPONENT] == "connector"
    ]
    (c,) = pod_spec(connector)["containers"]
    args = build_parser().parse_args(c["args"])
    cfg = config_from_args(args, service_account_dir=Path("/nonexistent"))
    assert {name: role for role, name in cfg.deployments.items()} == workers
    assert cfg.namespace == NAMESPACE and args.model == chart_values(values_file)["fleet"]["model"]
    assert connector["spec"]["replicas"] == 1  # two connectors never act at once
    assert connector["spec"]["strategy"]["type"] == "Recreate"
    (role,) = of_kind(docs, "Role")
    assert role["rules"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["deployments/scale"],
            "resourceNames": sorted(workers),
            "verbs": ["get", "patch"],
        }
    ]
    (binding,) = of_kind(docs, "RoleBinding")
    account = pod_spec(connector)["serviceAccountName"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    ]
    assert account in by_name(docs, "ServiceAccount")
    for doc in with_pods(docs):  # no other pod holds an API token
        if doc is not connector:
            assert pod_spec(doc)["automountServiceAccountToken"] is False, doc["metadata"]["name"]
    planner = by_name(docs, "Deployment")[f"{RELEASE}-planner"]
    (p,) = pod_spec(planner)["containers"]
    assert sorted(arg_after(p["args"], "--roles").split(",")) == sorted(set(workers.values()))
    for deployment in workers:  # the connector owns the replicas
        assert "replicas" not in by_name(docs, "Deployment")[deployment]["spec"]


# --- the matrix' own points ---------------------------------------------------------------------


def test_disaggregated_fleet_has_a_prefill_and_a_decode_pool_on_gpus() -> None:
    docs = render("disaggregated.yaml")
    roles = {}
    for doc, c in containers(docs):
        if pod_labels(doc).get(COMPONENT) == "worker":
            roles[arg_after(c["args"], "--role")] = c
    assert set(roles) == {"prefill", "decode"}
    for c in roles.values():
        assert arg_after(c["args"], "--engine") == "vllm"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 4
        assert arg_after(c["args"], "--tensor-parallel-size") == "4"
        assert arg_after(c["args"], "--kv-connector") == "NixlConnector"
    assert arg_after(roles["prefill"]["args"], "--kv-role") == "kv_producer"
    assert arg_after(roles["decode"]["args"], "--kv-role") == "kv_consumer"


def test_vllm_workers_get_gpus_the_model_and_writable_caches() -> None:
    docs = render("vllm-aggregated.yaml")
    (worker,) = [d for d in of_kind(docs, "Deployment") if pod_labels(d)[COMPONENT] == "worker"]
    (c,) = pod_spec(worker)["containers"]
    assert (
        c["resources"]["requests"]["nvidia.com/gpu"]
        == c["resources"]["limits"]["nvidia.com/gpu"]
        == 1
    )
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is True and "/dev/shm" in mounts
    assert arg_after(c["args"], "--model").startswith("/models/")
    assert c["image"] == "registry.example.com/jetfleet-vllm:0.1.0"
    assert env_of(c)["XDG_CACHE_HOME"]["value"] in mounts
    assert "kv_cache_dtype=fp8" in c["args"]


def test_external_fleet_runs_no_servers_and_passes_the_urls_to_every_component() -> None:
    docs = render("external.yaml")
    values = chart_values("external.yaml")
    assert not of_kind(docs, "StatefulSet")
    (secret,) = [s for s in of_kind(docs, "Secret") if "nats-url" in s.get("stringData", {})]
    assert secret["stringData"]["nats-url"] == values["nats"]["url"]
    users_of_redis = {"frontend", "router", "indexer"}
    seen = set()
    for doc, c in containers(docs):
        if not is_jetfleet(c):
            continue
        component = pod_labels(doc)[COMPONENT]
        seen.add(component)
        env = env_of(c)
        nats = env["JETFLEET_NATS_URL"]["valueFrom"]["secretKeyRef"]
        assert nats == {"name": secret["metadata"]["name"], "key": "nats-url"}, component
        if component in users_of_redis:
            redis = env["JETFLEET_REDIS_URL"]["valueFrom"]["secretKeyRef"]
            assert redis == {"name": "managed-redis", "key": "url"}, component
        assert f"{RELEASE}-nats" not in str(c) and f"{RELEASE}-redis" not in str(c), component
    assert {"frontend", "router", "indexer", "planner", "worker", "connector", "infra-init"} <= seen


def test_redis_has_replicas_and_sentinels_the_fleet_finds_it_through() -> None:
    """The data pods and sentinels (quorum), the fleet's URL names the sentinels' Service and
    the monitored service, the password comes from the Secret; the start scripts are valid sh."""
    from base.connect import parse_sentinel_url

    docs = render("sentinel.yaml")
    values = chart_values("sentinel.yaml")["redis"]
    sets = by_name(docs, "StatefulSet")
    assert sets[f"{RELEASE}-redis"]["spec"]["replicas"] == values["replicas"]
    assert sets[f"{RELEASE}-redis-sentinel"]["spec"]["replicas"] == values["sentinel"]["replicas"]
    frontend = by_name(docs, "Deployment")[f"{RELEASE}-frontend"]
    env = env_of(pod_spec(frontend)["containers"][0])
    url = env["JETFLEET_REDIS_URL"]["value"].replace("$(JETFLEET_REDIS_PASSWORD)", "pw")
    parsed = parse_sentinel_url(url)
    assert parsed.password == "pw"
    secret_ref = env["JETFLEET_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    secret = by_name(docs, "Secret")[secret_ref["name"]]
    assert secret["stringData"][secret_ref["key"]] == values["auth"]["password"]
    [(host, port)] = parsed.sentinels
    assert port in [p["port"] for p in by_name(docs, "Service")[host]["spec"]["ports"]]
    scripts = by_name(docs, "ConfigMap")[f"{RELEASE}-redis-scripts"]["data"]
    monitor = f"sentinel monitor {parsed.service} "
    assert monitor in scripts["start-sentinel.sh"]
    quorum = scripts["start-sentinel.sh"].split(monitor)[1].split("\n")[0].split()[-1]
    assert quorum == str(values["sentinel"]["quorum"])
    assert f"get-master-addr-by-name {parsed.service}" in scripts["start-redis.sh"]
    for name, text in scripts.items():
        checked = subprocess.run(["sh", "-n"], input=text, text=True, capture_output=True)
        assert checked.returncode == 0, (name, checked.stderr)


def test_bundled_nats_is_a_jetstream_cluster_the_streams_replicate_over() -> None:
    docs = render("mocker.yaml")
    values = chart_values("mocker.yaml")
    nats = by_name(docs, "StatefulSet")[f"{RELEASE}-nats"]
    assert nats["spec"]["replicas"] == values["nats"]["replicas"] == 3
    conf = by_name(docs, "ConfigMap")[f"{RELEASE}-nats-config"]["data"]["nats.conf"]
    routes = re.findall(r"nats://(\S+):6222", conf)
    assert routes == [f"{RELEASE}-nats-{i}.{nats['spec']['serviceName']}" for i in range(3)]
    assert "sync_interval: always" in conf
    (job,) = of_kind(docs, "Job")
    assert "post-install" in job["metadata"]["annotations"]["helm.sh/hook"]
    (c,) = pod_spec(job)["containers"]
    assert c["args"][:4] == ["infra", "init", "--replicas", str(values["fleet"]["streamReplicas"])]
    standalone = by_name(docs, "StatefulSet")[f"{RELEASE}-redis"]
    assert standalone["spec"]["replicas"] == 1 and f"{RELEASE}-redis-sentinel" not in by_name(
        docs, "StatefulSet"
    )


def test_monitors_select_pods_that_exist_and_every_ops_port() -> None:
    docs = render("monitoring.yaml")
    (sm,) = of_kind(docs, "ServiceMonitor")
    (pm,) = of_kind(docs, "PodMonitor")
    pods = {d["metadata"]["name"]: d for d in of_kind(docs, *WORKLOADS)}
    services = [
        s
        for s in of_kind(docs, "Service")
        if selects(sm["spec"]["selector"], s["metadata"]["labels"])
    ]
    assert services, "the ServiceMonitor selects no Service"
    for svc in services:
        assert {e["port"] for e in sm["spec"]["endpoints"]} <= {
            p["name"] for p in svc["spec"]["ports"]
        }
        assert any(svc["spec"]["selector"].items() <= pod_labels(d).items() for d in pods.values())
    scraped = [d for d in pods.values() if selects(pm["spec"]["selector"], pod_labels(d))]
    assert scraped, "the PodMonitor selects no pods"
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    for doc in pods.values():
        ports = {p["name"] for c in pod_spec(doc)["containers"] for p in c.get("ports", [])}
        frontend = pod_labels(doc)[COMPONENT] == "frontend"
        has_ops = endpoint["port"] in ports and is_jetfleet(pod_spec(doc)["containers"][0])
        assert (doc in scraped) == (has_ops and not frontend), doc["metadata"]["name"]
    for monitor in (sm, pm):
        assert monitor["metadata"]["labels"]["release"] == "prometheus"


def test_the_prometheus_rule_is_the_rules_file() -> None:
    (rule,) = of_kind(render("monitoring.yaml"), "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_the_dashboard_is_the_grafana_file_for_the_sidecar() -> None:
    import json

    cm = by_name(render("monitoring.yaml"), "ConfigMap")[f"{RELEASE}-dashboard"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["jetfleet-dashboard.json"]) == json.loads(DASHBOARD.read_text())


def test_monitoring_is_off_by_default() -> None:
    assert not [d for d in render("mocker.yaml") if d["apiVersion"].startswith(CRD_GROUP)]


@pytest.mark.parametrize(
    ("sets", "error"),
    [
        (("workers.pools[1].name=agg2", "workers.pools[1].role=agg"), "roles agg twice"),
        (("workers.pools[0].role=encode",), "none of agg, prefill, decode"),
        (("workers.pools[0].terminationGracePeriodSeconds=30",), "must exceed drainTimeoutSeconds"),
        (("nats.enabled=false",), "set nats.url"),
        (("redis.enabled=false",), "set redis.url"),
        (("fleet.streamReplicas=5",), "exceeds nats.replicas"),
        (("redis.auth.enabled=true",), "set redis.auth.password"),
    ],
)
def test_inconsistent_values_are_refused(sets: tuple[str, ...], error: str) -> None:
    args = ["template", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(CI / "mocker.yaml")]
    for item in sets:
        args += ["--set", item]
    done = run_helm(*args)
    assert done.returncode != 0 and error in done.stderr, done.stderr
