"""The operations app: /health follows the health check, everything else is Prometheus."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry, Counter

from base.ops_http import nats_connected, ops_app


def call(app, path: str) -> tuple[str, bytes]:
    seen: dict[str, str] = {}

    def start_response(status: str, headers: list) -> None:
        seen["status"] = status

    env = {"PATH_INFO": path, "REQUEST_METHOD": "GET", "QUERY_STRING": ""}
    body = b"".join(app(env, start_response))
    return seen["status"], body


def test_health_follows_the_check_and_metrics_are_served() -> None:
    registry = CollectorRegistry()
    Counter("jetfleet_test_things", "things", registry=registry).inc(3)
    state = {"ok": True}
    app = ops_app(registry, lambda: (state["ok"], "" if state["ok"] else "draining"))
    status, body = call(app, "/health")
    assert status.startswith("200") and json.loads(body) == {"status": "ok"}
    state["ok"] = False
    status, body = call(app, "/health")
    assert status.startswith("503")
    assert json.loads(body) == {"status": "unavailable", "detail": "draining"}
    status, body = call(app, "/metrics")
    assert status.startswith("200") and b"jetfleet_test_things_total 3.0" in body


def test_a_raising_check_is_unhealthy() -> None:
    def boom() -> tuple[bool, str]:
        raise RuntimeError("no engine")

    status, body = call(ops_app(CollectorRegistry(), boom), "/ready")
    assert status.startswith("503") and "no engine" in json.loads(body)["detail"]


def test_a_nats_only_process_is_healthy_while_connected() -> None:
    class Conn:
        is_connected = True

    conn = Conn()
    app = ops_app(CollectorRegistry(), nats_connected(conn))
    assert call(app, "/health")[0].startswith("200")
    conn.is_connected = False
    status, body = call(app, "/health")
    assert status.startswith("503")
    assert json.loads(body) == {"status": "unavailable", "detail": "NATS disconnected"}
