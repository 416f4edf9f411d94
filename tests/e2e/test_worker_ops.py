"""A worker process's operations port: /health for probes and /metrics for Prometheus."""

from __future__ import annotations

import urllib.request

import pytest

from base.ports import free_port
from base.process import wait_http_ok
from infra.command import cli_command
from tests.support.fleet import Fleet

pytestmark = pytest.mark.integration


def test_worker_serves_health_and_metrics(nats_server, tmp_path) -> None:
    fleet = Fleet(nats_server.url, tmp_path)
    port = free_port()
    try:
        fleet.add_worker("--metrics-port", str(port))
        wait_http_ok(f"http://127.0.0.1:{port}/health", 60, fleet.group)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        assert "jetfleet_worker" in text
    finally:
        fleet.stop()


def test_vllm_engine_without_vllm_fails_clearly(tmp_path) -> None:
    """Runs on every machine: a ``vllm`` package that cannot be imported shadows any installed
    one on the worker's path, as on a machine without vLLM."""
    import os
    import subprocess

    shadow = tmp_path / "vllm"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('No module named vllm (shadowed)')\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
    }
    out = subprocess.run(
        cli_command("worker", "--engine", "vllm", "--nats", "nats://127.0.0.1:1"),
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 2, out.stderr
    assert "bash infra/bootstrap.sh vllm" in out.stderr
    assert "Traceback" not in out.stderr
