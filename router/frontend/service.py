"""Run one frontend process: NATS, discovery, the routing library, uvicorn (TCP_NODELAY)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import structlog
import uvicorn
from prometheus_client import CollectorRegistry

from base.connection_metrics import ConnectionGauges
from base.tracing import Tracing
from router.frontend.http import Frontend, FrontendConfig
from router.frontend.metrics import FrontendMetrics
from router.stack import RoutingStack, StackConfig

log = structlog.get_logger("jetfleet.frontend")


@dataclass(frozen=True)
class FrontendServiceConfig:
    stack: StackConfig
    host: str = "127.0.0.1"
    port: int = 8000
    http: FrontendConfig = field(default_factory=FrontendConfig)
    frontend_id: str = field(default_factory=lambda: f"fe-{uuid.uuid4().hex[:8]}")
    keep_alive_s: float = 620.0
    """Idle keep-alive connections stay open this long. Above every common proxy's idle timeout
    (AWS ALB 60 s, nginx 75 s, Google Cloud LB 600 s): a proxy, not the server, closes an idle
    pooled connection, so a request never lands on a connection the server is closing."""
    reuse_port: bool = False
    """SO_REUSEPORT: several frontend processes listen on one port (``--processes N``)."""


def listening_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A listening socket with TCP_NODELAY (Linux passes it on to accepted connections); with
    ``reuse_port`` the kernel spreads new connections over every process bound to the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class _Server(uvicorn.Server):
    """uvicorn's graceful stop on SIGTERM/SIGINT (stop accepting, let in-flight requests and
    streams finish), without its re-raise of the signal afterwards: that re-raise killed the
    process before ``run_frontend`` closed its NATS and Redis connections, and made a clean
    stop exit with -15."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        sigs = (signal.SIGTERM, signal.SIGINT)
        for sig in sigs:
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig in sigs:
                loop.remove_signal_handler(sig)


async def run_frontend(cfg: FrontendServiceConfig) -> None:
    tracing = Tracing("jetfleet-frontend", cfg.frontend_id)  # OTLP export if configured
    metrics = FrontendMetrics(CollectorRegistry())
    sock = listening_socket(cfg.host, cfg.port, cfg.reuse_port)  # first: a taken port fails fast
    stack = await RoutingStack.open(
        cfg.stack, cfg.frontend_id, metrics.count_placement, metrics.count_worker_change
    )
    stack.client.holding.on_held = metrics.held.set
    stack.client.holding.reporter = cfg.frontend_id
    app = Frontend(
        cfg.http,
        stack.discovery,
        stack.client,
        metrics,
        cfg.frontend_id,
        # /ready needs Redis only where routing cannot go on without it
        stack.redis if cfg.stack.routes_only_with_redis else None,
        tracing,
    )
    server = _Server(
        uvicorn.Config(
            app,
            loop="none",
            http="httptools",
            lifespan="off",
            access_log=False,
            proxy_headers=False,
            log_level="warning",
            timeout_graceful_shutdown=30,
            timeout_keep_alive=int(cfg.keep_alive_s),
            backlog=2048,
        )
    )
    log.info(
        "frontend_listening",
        url=f"http://{cfg.host}:{sock.getsockname()[1]}/v1",
        router=cfg.stack.router,
        frontend_id=cfg.frontend_id,
    )
    await app.start()
    connections = ConnectionGauges(metrics.registry, stack.nc, stack.redis).start()
    try:
        await server.serve(sockets=[sock])
    finally:
        connections.cancel()
        await app.close()
        await stack.close()
        tracing.shutdown()
        log.info("frontend_stopped", frontend_id=cfg.frontend_id)
