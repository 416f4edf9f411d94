"""The kubernetes connector's pure parts (role mapping, credential choice, flags, error text).
The Helm chart's connector and its Role, consistent with them: tests/unit/test_helm_chart.py."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from infra.cli.connectors import add_kubernetes_args, config_from_args
from planner.connectors.kubernetes import (
    NO_ANSWER,
    KubernetesScalerConfig,
    api_error_detail,
    parse_deployments,
    pick_namespace,
    resolve_auth,
    retryable,
)


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        ([], {}),
        (["agg=jetfleet-agg"], {"agg": "jetfleet-agg"}),
        (
            ["prefill=jf-prefill", " decode = jf.decode-1 "],
            {"prefill": "jf-prefill", "decode": "jf.decode-1"},
        ),
        (["agg=a", "agg=a"], {"agg": "a"}),  # repeated, same target: fine
    ],
)
def test_parse_deployments(items: list[str], expected: dict[str, str]) -> None:
    assert parse_deployments(items) == expected


@pytest.mark.parametrize(
    ("items", "error"),
    [
        (["agg"], "ROLE=DEPLOYMENT"),
        (["=x"], "ROLE=DEPLOYMENT"),
        (["agg="], "ROLE=DEPLOYMENT"),
        (["agg=Jetfleet"], "not a valid Deployment name"),
        (["agg=-x"], "not a valid Deployment name"),
        (["agg=a_b"], "not a valid Deployment name"),
        (["agg=a", "agg=b"], "mapped twice"),
    ],
)
def test_parse_deployments_rejects(items: list[str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_deployments(items)


IN_POD = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}


@pytest.mark.parametrize(
    ("auth", "api_server", "kubeconfig", "environ", "default_exists", "expected"),
    [
        ("auto", "https://k:6443", None, IN_POD, True, "api-server"),  # explicit flag wins
        ("auto", None, None, IN_POD, True, "in-cluster"),
        ("auto", None, None, {}, True, "kubeconfig"),
        ("auto", None, "/tmp/kc", {}, False, "kubeconfig"),
        ("auto", None, None, {"KUBERNETES_SERVICE_HOST": ""}, True, "kubeconfig"),
        ("in-cluster", "https://k:6443", None, {}, False, "in-cluster"),  # asked for: no guess
        ("kubeconfig", None, None, IN_POD, False, "kubeconfig"),
        ("api-server", "http://127.0.0.1:8001", None, IN_POD, True, "api-server"),
    ],
)
def test_resolve_auth(
    auth: str,
    api_server: str | None,
    kubeconfig: str | None,
    environ: dict[str, str],
    default_exists: bool,
    expected: str,
) -> None:
    cfg = KubernetesScalerConfig(
        deployments={}, auth=auth, api_server=api_server, kubeconfig=kubeconfig
    )
    assert resolve_auth(cfg, environ, default_exists) == expected


def test_resolve_auth_without_any_credentials() -> None:
    with pytest.raises(ValueError, match="no Kubernetes credentials"):
        resolve_auth(KubernetesScalerConfig(deployments={}), {}, False)
    with pytest.raises(ValueError, match="needs --api-server"):
        resolve_auth(KubernetesScalerConfig(deployments={}, auth="api-server"), IN_POD, True)


@pytest.mark.parametrize(
    ("flag", "pod_namespace", "expected"),
    [
        ("jetfleet", "other", "jetfleet"),
        (None, "other\n", "other"),
        (None, None, "default"),
        ("", "  ", "default"),
    ],
)
def test_pick_namespace(flag: str | None, pod_namespace: str | None, expected: str) -> None:
    assert pick_namespace(flag, pod_namespace) == expected


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        *[(NO_ANSWER, True), (409, True), (429, True), (500, True), (503, True)],
        *[(400, False), (401, False), (403, False), (404, False), (422, False)],
    ],
)
def test_retryable(status: int, expected: bool) -> None:
    assert retryable(status) is expected


@pytest.mark.parametrize(
    ("status", "reason", "body", "expected"),
    [
        (
            403,
            "Forbidden",
            b'{"kind":"Status","message":"deployments.apps \\"x\\" is forbidden:\\n no",'
            b'"code":403}',
            '403 Forbidden: deployments.apps "x" is forbidden: no',
        ),
        (502, "Bad Gateway", b"<html>upstream down</html>", "502 Bad Gateway: <html>upstream"),
        (500, "Internal Server Error", None, "500 Internal Server Error"),
        (409, "Conflict", "[1, 2]", "409 Conflict"),  # JSON but not a Status
    ],
)
def test_api_error_detail(status: int, reason: str, body: bytes | None, expected: str) -> None:
    assert api_error_detail(status, reason, body).startswith(expected)


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_kubernetes_args(p)
    return p.parse_args(list(argv))


def test_config_from_args(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("s3cret\n")
    (tmp_path / "namespace").write_text("pod-ns")
    args = _args(
        "--deployment",
        "prefill=jf-prefill",
        "--deployment",
        "decode=jf-decode",
        "--api-server",
        "https://k:6443",
        "--token-file",
        str(tmp_path / "token"),
        "--insecure-skip-tls-verify",
        "--retries",
        "1",
    )
    cfg = config_from_args(args, service_account_dir=tmp_path)
    assert cfg.deployments == {"prefill": "jf-prefill", "decode": "jf-decode"}
    assert cfg.namespace == "pod-ns"
    assert cfg.token == "s3cret"
    assert "s3cret" not in repr(cfg)
    assert cfg.insecure_skip_tls_verify and cfg.retries == 1 and cfg.auth == "auto"

    cfg = config_from_args(
        _args("--deployment", "agg=a", "--namespace", "ns", "--token", "t"),
        service_account_dir=tmp_path / "absent",
    )
    assert (cfg.namespace, cfg.token) == ("ns", "t")


@pytest.mark.parametrize(
    "argv",
    [
        ["--deployment", "agg"],
        ["--deployment", "agg=a", "--token-file", "/nonexistent/token"],
        ["--deployment", "agg=a", "--retries", "-1"],
    ],
)
def test_config_from_args_rejects(argv: list[str]) -> None:
    with pytest.raises(ValueError):
        config_from_args(_args(*argv), service_account_dir=Path("/nonexistent"))


def test_deployment_flag_is_required() -> None:
    with pytest.raises(SystemExit):
        _args("--namespace", "x")
