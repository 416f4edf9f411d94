"""The frontend's HTTP layer: a plain ASGI app (served by uvicorn, ``service.py``) with a route
table, API keys, request ids, tracing, the access log, errors, and the operations endpoints.

Routes (``ROUTES``):

    POST /v1/chat/completions        chat.py           OpenAI chat completions
    POST /v1/completions             completions.py    OpenAI completions (text, ids, embeds)
    POST /v1/responses               responses_endpoints.py  OpenAI Responses
    *    /v1/responses/{id}[/...]    responses_endpoints.py  stored responses: GET, DELETE,
                                     GET .../input_items, POST .../cancel
    *    /v1/files[/{id}[/content]]  batch_service.py  the Batch API's files
    *    /v1/batches[/{id}[/cancel]] batch_service.py  the Batch API
    POST /v1/messages                anthropic.py      Anthropic Messages
    POST /v1/messages/count_tokens   anthropic.py      Anthropic token counting
    POST /v1/embeddings              embeddings.py     OpenAI embeddings
    GET  /v1/models                  here              the models with a live worker
    *    /health, /ready, /metrics   here              liveness, readiness, Prometheus (any method)
    GET  /discovery/prometheus       here              Prometheus HTTP service discovery

The four generation endpoints and embeddings answer another method with 405; the others with
404, as an unknown path. ``/v1/*`` needs ``Authorization: Bearer <key>`` (or Anthropic's
``x-api-key``) when keys are configured. Every response carries ``X-Request-Id`` (the client's
when it is a sane id, else a new one). Errors are OpenAI's JSON error object (Anthropic's under
``/v1/messages``), 503 and 429 with ``Retry-After``; an unexpected exception is a logged 500,
never a dropped connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
import structlog
from prometheus_client import CONTENT_TYPE_LATEST

from base.ops_presence import OpsDirectory
from base.tracing import Span, Tracing
from router.client import FleetClient
from router.discovery import Discovery
from router.frontend import anthropic, asgi, chat, completions, embeddings
from router.frontend.batch_pace import BatchPace
from router.frontend.batch_service import BatchService
from router.frontend.batch_store import BatchStore
from router.frontend.errors import OpenAIError
from router.frontend.metrics import FrontendMetrics
from router.frontend.observe import Observer
from router.frontend.responses_background import BackgroundRunner
from router.frontend.responses_endpoints import Responses
from router.frontend.responses_store import ResponsesStore
from router.frontend.serving import Serving
from router.frontend.shapes import encode
from router.frontend.tokenize import PromptTokenizer, TokenizeConfig, TokenizeMetrics
from router.generation import Generation
from schemas import Request

log = structlog.get_logger("jetfleet.frontend")
access_log = structlog.get_logger("jetfleet.access")

_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_:")


@dataclass(frozen=True)
class FrontendConfig:
    api_keys: tuple[str, ...] = ()  # when set, /v1/* needs "Authorization: Bearer <key>"
    retry_after_s: int = 1  # Retry-After on 503
    max_body_mb: float = 32.0
    """Largest request body accepted, in MiB (413 above; a 121k-token prompt is about 1 MiB)."""
    tokenize: TokenizeConfig = field(default_factory=TokenizeConfig)
    """Tokenizing lanes and the prompt prefix cache (``router/frontend/tokenize.py``)."""
    access_log: bool = True
    """One log line per /v1 request: id, model, status, latency, tokens, worker, attempts."""
    max_file_mb: float = 100.0
    """Largest Batch API file accepted (413 above)."""
    batch_concurrency: int = 16
    """Batch API lines in flight at most on this frontend (all the batches it runs)."""
    batch_pace: bool = True
    """Fewer batch lines in flight while the interactive requests' time to first token rises
    above its quiet level, or the frontend's event loop lags (``batch_pace.py``)."""
    batch_ttft_slack: float = 0.05
    """How far above its quiet level the interactive time to first token (its p90) may rise
    before the batch lines back off."""
    batch_window_s: float = 24 * 3600.0
    """A batch not done this long after it was created expires (OpenAI's completion window is
    24 h; shorter for trials): its unanswered lines go to the error file as ``batch_expired``."""
    takeover_lease_s: float = 10.0
    """A background response or a batch this frontend runs is taken over by another this long
    after the frontend stops renewing its lease (it died, or was cut off)."""


Handler = Callable[["Frontend", asgi.Call], Awaitable[None]]


@dataclass(frozen=True)
class Route:
    handler: Handler
    methods: tuple[str, ...] | None = ("POST",)  # None: any
    wrong_method: int = 405  # or 404: answered as an unknown path
    counted_as: str | None = None  # a generation endpoint: refusals counted under this label


def _api(serve: Callable[[asgi.Call, Serving], Awaitable[None]]) -> Handler:
    """An API family's endpoint (``serve(call, serving)``) as a route's handler."""

    async def handler(fe: Frontend, call: asgi.Call) -> None:
        await serve(call, fe.serving)

    return handler


class Frontend:
    def __init__(
        self,
        cfg: FrontendConfig,
        discovery: Discovery,
        client: FleetClient,
        metrics: FrontendMetrics,
        frontend_id: str,
        redis: aioredis.Redis | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        """``redis``: checked by ``/ready`` (given where routing cannot go on without it)."""
        self.cfg = cfg
        self.tracing = tracing or Tracing("jetfleet-frontend", frontend_id, env={})
        self.nc = client.nc
        self.discovery = discovery
        self.ops = OpsDirectory(client.nc, client.subjects)  # the services' operations ports
        self.metrics = metrics
        self.redis = redis
        self._auth = {f"Bearer {k}".encode() for k in cfg.api_keys}
        self.tokenizer = PromptTokenizer(cfg.tokenize, TokenizeMetrics(metrics.registry))
        observer = Observer(self.nc, client.subjects, metrics, frontend_id)
        self.serving = Serving(discovery, client, metrics, self.tokenizer, observer)
        store = ResponsesStore(client.nc, client.subjects)

        async def start_request(request: Request) -> Generation:
            """A taken-over request's next attempt, on the workers that ran it."""
            agg = client.state.candidates(request.model, "agg")
            return await client.launch(request, leg=client.agg if agg else client.decode)

        runner = BackgroundRunner(
            store,
            frontend_id,
            client.cancel,
            start_request,
            cfg.max_body_mb,
            lease_s=cfg.takeover_lease_s,
        )
        self.responses = Responses(self.serving, store, runner)
        self.batch = BatchService(
            BatchStore(client.nc, client.subjects),
            frontend_id,
            self._batch_line,
            cfg.batch_concurrency,
            cfg.max_file_mb,
            lease_s=cfg.takeover_lease_s,
            window_s=cfg.batch_window_s,
            pace=(
                BatchPace(cfg.batch_concurrency, cfg.batch_ttft_slack) if cfg.batch_pace else None
            ),
        )
        if self.batch.pace is not None:
            self.serving.on_first_token = self.batch.interactive_ttft

    async def _batch_line(self, call: asgi.Call) -> None:
        """A Batch API line through the route its url names (its errors as their JSON)."""
        path = call.scope["path"]
        await self._dispatch(call, ROUTES.get(path), path, "POST")

    async def start(self) -> None:
        """The background work: the background responses' leases (``responses_background``),
        the batches, the services' operations ports."""
        await self.responses.runner.start()
        await self.batch.start()
        await self.ops.start()

    async def close(self) -> None:
        await self.ops.stop()
        await self.batch.stop()
        await self.responses.runner.stop()
        await self.tokenizer.stop()

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        started = time.monotonic()
        ctx: dict[str, Any] = {"request_id": _client_request_id(scope) or uuid.uuid4().hex}
        api = path.startswith("/v1/")
        span: Span | None = None  # the operations endpoints (probes, scrapes) are not traced
        traceparent = ""
        if api:
            attributes = {"http.request.method": method, "url.path": path}
            parent = _header(scope, b"traceparent")
            span = self.tracing.start(f"{method} {path}", parent, "server", attributes)
            ctx["trace_id"], traceparent = span.trace_id, span.traceparent
        status = [0]
        echo = (b"x-request-id", ctx["request_id"].encode())

        async def send_with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), echo]}
            await send(message)

        call = asgi.Call(
            scope, receive, send_with_id, ctx, traceparent, started, self.cfg.max_body_mb
        )
        route = ROUTES.get(path)
        if route is None:
            route = _by_prefix(path)
        try:
            await self._dispatch(call, route, path, method)
        finally:
            code = status[0] or 499  # 499: the client left before any response
            if route is not None and route.counted_as and "outcome" not in ctx:
                # refused before it ran: counted by its status
                model = ctx.get("model", "unknown")
                self.metrics.requests.labels(model, route.counted_as, str(code)).inc()
            if span is not None:
                attributes = {f"jetfleet.{k}": v for k, v in ctx.items()}
                span.end(
                    {"http.response.status_code": code, **attributes},
                    error=f"HTTP {code}" if code >= 500 else None,
                )
            if self.cfg.access_log and api:
                ms = round((time.monotonic() - started) * 1000, 2)
                access_log.info("request", method=method, path=path, status=code, ms=ms, **ctx)

    async def _dispatch(self, call: asgi.Call, route: Route | None, path: str, method: str) -> None:
        try:
            if path.startswith("/v1/") and self._auth and not self._authorized(call.scope):
                raise OpenAIError(
                    401,
                    "Invalid or missing API key",
                    type="authentication_error",
                    code="invalid_api_key",
                )
            if route is not None and route.methods is not None and method not in route.methods:
                if route.wrong_method == 405:
                    raise OpenAIError(405, f"Method {method} not allowed on {path}")
                route = None
            if route is None:
                raise OpenAIError(404, f"Unknown path {path}", type="not_found_error")
            await route.handler(self, call)
        except OpenAIError as err:
            await self._error(call.send, err, path)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: still an OpenAI-style JSON error, and logged
            log.exception("frontend_unhandled_error", path=path, error=str(exc))
            with contextlib.suppress(Exception):
                internal = OpenAIError(500, "internal error", type="server_error")
                await self._error(call.send, internal, path)

    def _authorized(self, scope: asgi.Scope) -> bool:
        """``Authorization: Bearer <key>`` (OpenAI clients) or ``x-api-key: <key>`` (Anthropic)."""
        for k, v in scope["headers"]:
            if (k == b"authorization" and v in self._auth) or (
                k == b"x-api-key" and b"Bearer " + v in self._auth
            ):
                return True
        return False

    async def _error(self, send: asgi.Send, err: OpenAIError, path: str) -> None:
        headers = []
        if err.status in (429, 503):
            headers.append((b"retry-after", str(self.cfg.retry_after_s).encode()))
        body = anthropic.error_body(err) if path.startswith("/v1/messages") else err.body()
        await asgi.send_json(send, err.status, body, headers)

    # ---- the Responses API (responses_endpoints.py)
    async def create_response(self, call: asgi.Call) -> None:
        await self.responses.create(call)

    async def stored_response(self, call: asgi.Call) -> None:
        await self.responses.stored(call)

    async def files(self, call: asgi.Call) -> None:
        await self.batch.files(call)

    async def batches(self, call: asgi.Call) -> None:
        await self.batch.batches(call)

    # ---- the operations endpoints
    async def models(self, call: asgi.Call) -> None:
        await asgi.send_json(call.send, 200, encode(self.models_body()))

    async def health(self, call: asgi.Call) -> None:
        ok = bool(self.nc.is_connected)
        body = encode({"status": "ok" if ok else "nats down"})
        await asgi.send_json(call.send, 200 if ok else 503, body)

    async def ready(self, call: asgi.Call) -> None:
        reasons = await self.not_ready()
        live = sorted(self.discovery.state.models())
        body = encode({"ready": not reasons, "reasons": reasons, "live_models": live})
        await asgi.send_json(call.send, 503 if reasons else 200, body)

    async def prometheus(self, call: asgi.Call) -> None:
        exposition = self.metrics.exposition()
        await asgi.send_text(call.send, 200, exposition, CONTENT_TYPE_LATEST.encode())

    async def scrape_targets(self, call: asgi.Call) -> None:
        await asgi.send_json(call.send, 200, encode(self.scrape_target_list()))

    def scrape_target_list(self) -> list[dict[str, Any]]:
        """Prometheus HTTP service discovery (``http_sd_configs`` in
        infra/deploy/prometheus/prometheus.yml): every live worker's operations port, from the
        fleet's discovery, and every service's (router, indexer, planner, connector), from
        ``fleet_ops_endpoints``; each labelled with its ``component``."""
        out = []
        for view in sorted(self.discovery.state.workers.values(), key=lambda v: v.worker_id):
            reg = view.reg
            if reg.metrics_url:
                labels = {
                    "component": "worker",
                    "worker_id": reg.worker_id,
                    "model": reg.model,
                    "role": reg.role,
                }
                out.append({"targets": [_host_port(reg.metrics_url)], "labels": labels})
        for e in self.ops.live():
            labels = {"component": e.component, "instance_id": e.instance}
            if e.model:
                labels["model"] = e.model
            out.append({"targets": [_host_port(e.url)], "labels": labels})
        return out

    def models_body(self) -> dict[str, Any]:
        """Models with a live worker, and the LoRA adapters live workers have loaded (with the
        model they adapt as ``parent``, as vLLM lists them)."""
        live = self.discovery.state.models()
        served = {n: m for n, m in self.discovery.models.items() if n in live}
        data = [
            {
                "id": name,
                "object": "model",
                "created": int(m.card.created_at_s),
                "owned_by": "jetfleet",
                "root": name,
                "parent": None,
                "max_model_len": m.card.context_length,
            }
            for name, m in sorted(served.items())
        ]
        data += [
            {
                "id": lora,
                "object": "model",
                "created": int(served[base].card.created_at_s),
                "owned_by": "jetfleet",
                "root": lora,
                "parent": base,
                "max_model_len": served[base].card.context_length,
            }
            for lora, base in sorted(self.discovery.state.adapters().items())
            if base in served and lora not in served
        ]
        return {"object": "list", "data": data}

    async def not_ready(self) -> list[str]:
        """Why ``/ready`` says no (nothing: ready). A known model with no live worker is ready:
        a fleet the planner scaled to zero brings a worker back on demand, and demand only
        reaches a frontend its load balancer still routes to (``live_models`` in the body says
        which have a worker now)."""
        reasons = []
        if not self.nc.is_connected:
            reasons.append("nats disconnected")
        if not self.discovery.synced.is_set():
            reasons.append("discovery not synced")
        if self.redis is not None:
            try:
                await self.redis.ping()
            except Exception as exc:
                reasons.append(f"redis unavailable: {exc}")
        if not self.discovery.models:
            reasons.append("no model card published yet (no worker has started)")
        return reasons


ROUTES: dict[str, Route] = {
    "/v1/chat/completions": Route(_api(chat.serve), counted_as="chat"),
    "/v1/completions": Route(_api(completions.serve), counted_as="completions"),
    "/v1/responses": Route(Frontend.create_response, counted_as="responses"),
    "/v1/messages": Route(_api(anthropic.serve), counted_as="messages"),
    "/v1/messages/count_tokens": Route(_api(anthropic.count_tokens), wrong_method=404),
    "/v1/embeddings": Route(_api(embeddings.serve)),
    "/v1/files": Route(Frontend.files, ("GET", "POST")),
    "/v1/batches": Route(Frontend.batches, ("GET", "POST")),
    "/v1/models": Route(Frontend.models, ("GET",), 404),
    "/health": Route(Frontend.health, None),
    "/ready": Route(Frontend.ready, None),
    "/metrics": Route(Frontend.prometheus, None),
    "/discovery/prometheus": Route(Frontend.scrape_targets, ("GET",), 404),
}


PREFIXES = (  # routes with an id in the path: the handler reads the rest
    ("/v1/responses/", Route(Frontend.stored_response, None)),
    ("/v1/files/", Route(Frontend.files, None)),
    ("/v1/batches/", Route(Frontend.batches, None)),
)


def _by_prefix(path: str) -> Route | None:
    return next((route for prefix, route in PREFIXES if path.startswith(prefix)), None)


def _host_port(url: str) -> str:
    """A Prometheus target: an operations URL without its scheme."""
    return url.removeprefix("http://").removeprefix("https://")


def _header(scope: asgi.Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _client_request_id(scope: asgi.Scope) -> str | None:
    """The client's ``X-Request-Id`` when it is a sane id: at most 128 of [A-Za-z0-9-_:] (it
    becomes part of a NATS subject)."""
    text = _header(scope, b"x-request-id")
    return text if text and len(text) <= 128 and set(text) <= _ID_CHARS else None


async def _lifespan(receive: asgi.Receive, send: asgi.Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
