"""The operations port of a background process (worker, indexer, planner): ``/metrics`` for
Prometheus and ``/health`` for probes, on ``--metrics-port`` (``--metrics-host``, default
loopback; ``0.0.0.0`` in a pod so the kubelet can reach it).

``/health`` answers 200 ``{"status": "ok"}`` while the process's health check passes and 503
``{"status": "unavailable", "detail": ...}`` otherwise (e.g. NATS disconnected, or draining: a
draining worker must not be counted ready). Served by prometheus-client's WSGI app on a daemon
thread; the health callback only reads flags, so no lock is needed.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

HealthCheck = Callable[[], tuple[bool, str]]


class _Connection(Protocol):
    @property
    def is_connected(self) -> bool: ...


def nats_connected(nc: _Connection) -> HealthCheck:
    """The health check of a process whose only duty is its NATS connection."""
    return lambda: (True, "") if nc.is_connected else (False, "NATS disconnected")


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return


def ops_app(registry: CollectorRegistry, health: HealthCheck) -> Callable[..., Iterable[bytes]]:
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") in ("/health", "/ready"):
            try:
                ok, detail = health()
            except Exception as exc:  # a failing check is an unhealthy process
                ok, detail = False, f"health check failed: {exc}"
            body = {"status": "ok"} if ok else {"status": "unavailable", "detail": detail}
            start_response(
                "200 OK" if ok else "503 Service Unavailable",
                [("Content-Type", "application/json")],
            )
            return [json.dumps(body).encode()]
        return metrics(environ, start_response)  # type: ignore[no-any-return]

    return app


def start_ops_server(
    port: int, registry: CollectorRegistry, health: HealthCheck, host: str = "127.0.0.1"
) -> WSGIServer:
    server = make_server(host, port, ops_app(registry, health), handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="ops-http", daemon=True).start()
    return server
