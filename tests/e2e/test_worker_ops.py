"""A worker process's operations port: /health for probes and /metrics for Prometheus."""

from __future__ import annotations

import urllib.request

import pytest

from base.process import wait_http_ok
from tests.e2e.fleet import Fleet, free_port

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


def test_vllm_engine_without_vllm_fails_clearly() -> None:
    import importlib.util
    import subprocess

    from base.process import cli_command

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    out = subprocess.run(
        cli_command("worker", "--engine", "vllm", "--nats", "nats://127.0.0.1:1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "pip install 'jetfleet[vllm]'" in out.stderr
    assert "Traceback" not in out.stderr
