"""The OpenAI-compatible HTTP frontend (stateless; routes in-process through ``FleetClient``).

Endpoints: POST /v1/chat/completions, POST /v1/completions, POST /v1/responses, POST
/v1/messages (Anthropic), POST /v1/messages/count_tokens, GET /v1/models, GET /health, GET /ready,
GET /metrics. Responses and Messages bodies are translated into the chat request they mean and run
on the same generation path; only their response shapes differ.

Bad input gets an OpenAI-style JSON error with the right 4xx; an accepted
request ends in a full response, a complete SSE stream, or a clear error (in the stream when
streaming has begun). A client that disconnects cancels its generation on the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from nats.aio.client import Client as NATS
from prometheus_client import CONTENT_TYPE_LATEST

from base.tracing import Span, Tracing
from model.structured import problem as mocker_problem
from router.disagg_client import DisaggClient, DisaggGeneration
from router.discovery import Discovery, ServedModel
from router.frontend import anthropic, asgi, responses_api
from router.frontend.anthropic import MessagesShape
from router.frontend.anthropic import error_body as anthropic_error_body
from router.frontend.embeddings import embedding_dimensions_check, parse_embedding_request
from router.frontend.embeddings import response_body as embedding_response
from router.frontend.errors import OpenAIError, context_length_exceeded
from router.frontend.logprobs import CompletionLogprobs, chat_content, merge_completion
from router.frontend.metrics import FrontendMetrics
from router.frontend.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerationParams,
    chat_generation_params,
    completion_generation_params,
    parse_chat_request,
    parse_completion_request,
    resolve_max_tokens,
)
from router.frontend.output import ChoiceOutput, Delta
from router.frontend.prompt_embeds import PromptEmbedsError, decode_prompt_embeds
from router.frontend.responses import (
    ChatShape,
    CompletionShape,
    FullChoice,
    encode,
    usage_body,
)
from router.frontend.responses_api import ResponsesShape
from router.frontend.stops import StopMatcher
from router.frontend.tokenize import (
    PromptTokenizer,
    PromptTooLong,
    TokenizeConfig,
    TokenizeMetrics,
)
from router.generation import Generation, NoWorkersError, OverloadedError
from router.observation import observation
from schemas import Request, RequestObservation, SamplingParams
from schemas import encode as wire_encode
from schemas.trace import child_traceparent

AnyGeneration = Generation | DisaggGeneration
log = structlog.get_logger("jetfleet.frontend")
access_log = structlog.get_logger("jetfleet.access")

_ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
}
_ID_PREFIX = {"chat": "chatcmpl", "completions": "cmpl", "responses": "resp", "messages": "msg"}
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_:")


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


@dataclass
class _Choice:
    gen: AnyGeneration
    stops: StopMatcher
    out: ChoiceOutput
    text: list[str]  # content
    reasoning: list[str] = field(default_factory=list)
    calls: list[Any] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)  # chat entries / completions parts
    reason: str | None = None
    first_at: float = 0.0
    last_at: float = 0.0
    error: str | None = None
    echo: str | None = None  # completions echo: the prompt text, sent before the first token
    echo_done: bool = False


@dataclass(frozen=True)
class _Logprobs:
    """How one request's logprobs are shaped (None fields: not asked)."""

    k: int | None  # top-k per generated token
    echo_k: int | None  # completions echo with logprobs: prompt tokens too
    chat: bool
    token_text: Callable[[int], str]


class Frontend:
    def __init__(
        self,
        cfg: FrontendConfig,
        nc: NATS,
        discovery: Discovery,
        client: DisaggClient,
        metrics: FrontendMetrics,
        frontend_id: str,
        redis: Any | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.cfg = cfg
        self.tracing = tracing or Tracing("jetfleet-frontend", frontend_id, env={})
        self.nc = nc
        self.discovery = discovery
        self.client = client
        self.metrics = metrics
        self.frontend_id = frontend_id
        self.subjects = client.subjects
        self.redis = redis  # checked by /ready when routing needs it
        self._auth = {f"Bearer {k}".encode() for k in cfg.api_keys}
        self._max_body = int(cfg.max_body_mb * (1 << 20))
        self._active = 0  # generations in progress in this process
        self.tokenizer = PromptTokenizer(
            cfg.tokenize,
            TokenizeMetrics(metrics.registry),
        )

    async def close(self) -> None:
        await self.tokenizer.stop()

    # ------------------------------------------------------------------ ASGI entry
    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        started = time.monotonic()
        ctx: dict[str, Any] = {"request_id": _client_request_id(scope) or uuid.uuid4().hex}
        parent = _header(scope, b"traceparent")
        if self.tracing.exporting and path.startswith("/v1/"):
            span = self.tracing.start(
                f"{method} {path}",
                parent,
                "server",
                {"http.request.method": method, "url.path": path},
            )
        else:  # the context travels on, no span is recorded here
            span = Span(None, *child_traceparent(parent))
        ctx["trace_id"], traceparent = span.trace_id, span.traceparent
        status = [0]
        echo = (b"x-request-id", ctx["request_id"].encode())

        async def send_with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), echo]}
            await send(message)

        try:
            await self._route_http(scope, receive, send_with_id, path, method, ctx, traceparent)
        finally:
            if path in _ENDPOINTS and "outcome" not in ctx:  # refused: count it by its status
                model = ctx.get("model", "unknown")
                self.metrics.requests.labels(model, _ENDPOINTS[path], str(status[0] or 499)).inc()
            code = status[0] or 499
            span.end(
                {"http.response.status_code": code, **{f"jetfleet.{k}": v for k, v in ctx.items()}},
                error=f"HTTP {code}" if code >= 500 else None,
            )
            if self.cfg.access_log and path.startswith("/v1/"):
                access_log.info(
                    "request",
                    method=method,
                    path=path,
                    status=status[0] or 499,  # 499: the client left before any response
                    ms=round((time.monotonic() - started) * 1000, 2),
                    **ctx,
                )

    async def _route_http(
        self,
        scope: asgi.Scope,
        receive: asgi.Receive,
        send: asgi.Send,
        path: str,
        method: str,
        ctx: dict[str, Any],
        traceparent: str,
    ) -> None:
        try:
            if path.startswith("/v1/") and self._auth and not self._authorized(scope):
                raise OpenAIError(
                    401,
                    "Invalid or missing API key",
                    type="authentication_error",
                    code="invalid_api_key",
                )
            if path in _ENDPOINTS:
                if method != "POST":
                    raise OpenAIError(405, f"Method {method} not allowed on {path}")
                await self._generate(scope, receive, send, _ENDPOINTS[path], ctx, traceparent)
            elif path == "/v1/messages/count_tokens" and method == "POST":
                await self._count_tokens(receive, send)
            elif path == "/v1/embeddings":
                if method != "POST":
                    raise OpenAIError(405, f"Method {method} not allowed on {path}")
                await self._embeddings(receive, send, ctx, traceparent)
            elif path == "/v1/models" and method == "GET":
                await asgi.send_json(send, 200, encode(self._models_body()))
            elif path == "/health":
                ok = self.nc.is_connected
                await asgi.send_json(
                    send, 200 if ok else 503, encode({"status": "ok" if ok else "nats down"})
                )
            elif path == "/ready":
                await self._ready(send)
            elif path == "/metrics":
                await asgi.send_text(
                    send, 200, self.metrics.exposition(), CONTENT_TYPE_LATEST.encode()
                )
            elif path == "/discovery/prometheus" and method == "GET":
                await asgi.send_json(send, 200, encode(self._scrape_targets()))
            else:
                raise OpenAIError(404, f"Unknown path {path}", type="not_found_error")
        except OpenAIError as err:
            await self._error(send, err, anthropic=path.startswith("/v1/messages"))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: still an OpenAI-style JSON error, and logged
            log.exception("frontend_unhandled_error", path=path, error=str(exc))
            with contextlib.suppress(Exception):
                internal = OpenAIError(500, "internal error", type="server_error")
                await self._error(send, internal, anthropic=path.startswith("/v1/messages"))

    def _authorized(self, scope: asgi.Scope) -> bool:
        """``Authorization: Bearer <key>`` (OpenAI clients) or ``x-api-key: <key>`` (Anthropic)."""
        for k, v in scope["headers"]:
            if (k == b"authorization" and v in self._auth) or (
                k == b"x-api-key" and b"Bearer " + v in self._auth
            ):
                return True
        return False

    async def _error(self, send: asgi.Send, err: OpenAIError, anthropic: bool = False) -> None:
        headers = []
        if err.status in (429, 503):
            headers.append((b"retry-after", str(self.cfg.retry_after_s).encode()))
        body = anthropic_error_body(err) if anthropic else err.body()
        await asgi.send_json(send, err.status, body, headers)

    def _scrape_targets(self) -> list[dict[str, Any]]:
        """Prometheus HTTP service discovery: every live worker's operations port, from the
        fleet's discovery (``http_sd_configs`` in infra/deploy/prometheus.yml)."""
        out = []
        for view in sorted(self.discovery.state.workers.values(), key=lambda v: v.worker_id):
            reg = view.reg
            if reg.metrics_url:
                target = reg.metrics_url.removeprefix("http://").removeprefix("https://")
                labels = {"worker_id": reg.worker_id, "model": reg.model, "role": reg.role}
                out.append({"targets": [target], "labels": labels})
        return out

    def _models_body(self) -> dict[str, Any]:
        live = self.discovery.state.models()
        data = [
            {
                "id": name,
                "object": "model",
                "created": int(m.card.created_at_s),
                "owned_by": "jetfleet",
                "max_model_len": m.card.context_length,
            }
            for name, m in sorted(self.discovery.models.items())
            if name in live
        ]
        return {"object": "list", "data": data}

    async def _ready(self, send: asgi.Send) -> None:
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
        if not self._models_body()["data"]:
            reasons.append("no model has a live worker")
        status = 503 if reasons else 200
        await asgi.send_json(send, status, encode({"ready": not reasons, "reasons": reasons}))

    # ------------------------------------------------------------------ generation
    async def _read_body(self, receive: asgi.Receive) -> bytes:
        try:
            return await asgi.read_body(receive, self._max_body)
        except asgi.BodyTooLarge:
            raise OpenAIError(
                413,
                f"Request body larger than {self.cfg.max_body_mb:g} MiB",
                code="request_too_large",
            ) from None

    def _served(self, model: str) -> ServedModel:
        served = self.discovery.models.get(model)
        if served is None:  # a model the fleet has served waits for a worker, then 503s
            raise OpenAIError(
                404,
                f"The model `{model}` does not exist.",
                type="not_found_error",
                param="model",
                code="model_not_found",
            )
        return served

    async def _count_tokens(self, receive: asgi.Receive, send: asgi.Send) -> None:
        """Anthropic's ``/v1/messages/count_tokens``: the prompt's tokens, template included."""
        body = await self._read_body(receive)
        creq = parse_chat_request(anthropic.count_tokens_body(body))
        served = self._served(creq.model)
        prompt = await self._prompt_tokens(
            served, creq, True, len(body), chat_generation_params(creq)
        )
        await asgi.send_json(send, 200, encode({"input_tokens": len(prompt)}))

    async def _embeddings(
        self, receive: asgi.Receive, send: asgi.Send, ctx: dict[str, Any], traceparent: str
    ) -> None:
        accepted = time.monotonic()
        body = await self._read_body(receive)
        req = parse_embedding_request(body)
        served = self._served(req.model)
        card = served.card
        ctx["model"] = req.model
        if "embed" not in card.tasks:
            raise OpenAIError(
                400,
                f"The model `{req.model}` does not serve embeddings (its workers serve "
                f"{', '.join(card.tasks)}).",
                param="model",
            )
        if req.dimensions is not None:
            embedding_dimensions_check(card, req.model, req.dimensions)
        prompts = await asyncio.gather(
            *(self._embedding_tokens(served, item, len(body)) for item in req.inputs())
        )
        rid = f"embd-{ctx['request_id']}"
        now = time.time()
        requests = [
            Request(
                request_id=rid if len(prompts) == 1 else f"{rid}-{i}",
                model=req.model,
                token_ids=tuple(prompt),
                sampling=SamplingParams(max_tokens=1),
                created_at_s=now,
                detokenize=False,
                task="embed",
                dimensions=req.dimensions,
            )
            for i, prompt in enumerate(prompts)
        ]
        total = sum(len(p) for p in prompts)
        ctx.update(request_id=rid, prompt_tokens=total)
        gens = await self._submit(req.model, rid, requests, card.block_size, traceparent)
        status = "ok"
        vectors: list[tuple[float, ...]] = []
        error: str | None = None
        try:
            async with asgi.DisconnectWatcher(receive):
                for gen in gens:
                    async for chunk in gen:
                        if chunk.finish_reason is None:
                            continue
                        if chunk.embedding is None:
                            error = (
                                chunk.error
                                or f"the worker returned no embedding ({chunk.finish_reason})"
                            )
                        else:
                            vectors.append(chunk.embedding)
                    if error:
                        break
        except asyncio.CancelledError:
            status = "cancelled"
            for g in gens:
                await g.cancel()
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        finally:
            status = "error" if error and status == "ok" else status
            self.metrics.requests.labels(req.model, "embeddings", status).inc()
            ctx.update(outcome=status, worker_id=",".join(g.worker_id for g in gens))
            for gen in gens:
                await self._publish_observation(
                    req.model,
                    observation(
                        gen,
                        status=status,
                        accepted=accepted,
                        first_at=0.0,
                        last_at=time.monotonic(),
                        source=self.frontend_id,
                        finish_reason="stop" if not error else "error",
                        error=error,
                    ),
                )
        if status == "cancelled":
            return
        if error:
            raise OpenAIError(500, error, type="server_error")
        await asgi.send_json(
            send, 200, embedding_response(req.model, vectors, req.encoding_format, total)
        )

    async def _embedding_tokens(
        self, served: ServedModel, item: str | list[int], size: int
    ) -> list[int]:
        tok = served.tokenizer
        context = served.card.context_length
        if isinstance(item, list):
            if any(t >= tok.vocab_size for t in item):
                raise OpenAIError(
                    400, "input contains token ids outside the vocabulary", param="input"
                )
            ids = list(item)
        else:
            try:
                ids = await self.tokenizer.tokenize(
                    served.card.name, tok, lambda: item, context, size, idle=self._active == 0
                )
            except PromptTooLong as exc:
                raise _input_too_long(context, exc.at_least) from None
        if len(ids) > context:
            raise _input_too_long(context, len(ids))
        return ids

    async def _generate(
        self,
        scope: asgi.Scope,
        receive: asgi.Receive,
        send: asgi.Send,
        endpoint: str,
        ctx: dict[str, Any],
        traceparent: str,
    ) -> None:
        accepted = time.monotonic()
        body = await self._read_body(receive)
        chat = endpoint != "completions"
        original: dict[str, Any] = {}  # a Responses / Messages body, as sent
        creq: ChatCompletionRequest | CompletionRequest
        if endpoint == "completions":
            creq = parse_completion_request(body)
            params = completion_generation_params(creq)
        else:
            if endpoint in ("messages", "responses"):
                translate = (
                    anthropic.to_chat_body if endpoint == "messages" else responses_api.to_chat_body
                )
                body, original = translate(body)
            creq = parse_chat_request(body)
            params = chat_generation_params(creq)
        served = self._served(creq.model)
        ctx["model"] = creq.model  # a served model: a bounded label value
        card = served.card
        outputs = [self._choice_output(card, params, chat) for _ in range(params.n)]
        self._check_constraint(creq.model, params)
        embeds: bytes | None = None
        if isinstance(creq, CompletionRequest) and creq.prompt_embeds is not None:
            embeds, prompt_len = self._prompt_embeds(served, creq)
            prompt: list[int] = []
        else:
            prompt = await self._prompt_tokens(served, creq, chat, len(body), params)
            prompt_len = len(prompt)
        max_tokens = resolve_max_tokens(
            params.max_tokens,
            prompt_len,
            card.context_length,
            prompt_param="messages" if chat else "prompt",
        )
        rid = f"{_ID_PREFIX[endpoint]}-{ctx['request_id']}"
        ctx.update(request_id=rid, model=creq.model, prompt_tokens=prompt_len)
        special = served.tokenizer.special_tokens
        keep_special = any(m in special for o in outputs[:1] for m in o.markers)
        gens = await self._start(
            creq.model,
            rid,
            prompt,
            params,
            max_tokens,
            card.block_size,
            traceparent,
            skip_special_tokens=not keep_special,
            prompt_embeds=embeds,
        )
        echo = self._echo_text(served, creq, prompt) if params.echo else None
        choices = [
            _Choice(g, StopMatcher(params.stop), o, [], echo=echo)
            for g, o in zip(gens, outputs, strict=True)
        ]
        lp = None
        if params.logprobs is not None or params.prompt_logprobs is not None:
            lp = _Logprobs(params.logprobs, params.prompt_logprobs, chat, served.token_text)
        shape = _shape(endpoint, rid, creq.model, original, prompt_len)
        self.metrics.in_flight.inc()
        self._active += 1
        status = "ok"
        try:
            async with asgi.DisconnectWatcher(receive):
                if params.stream:
                    await self._stream(send, shape, choices, params.include_usage, prompt_len, lp)
                else:
                    await self._collect(send, shape, choices, prompt_len, lp)
        except asyncio.CancelledError:
            status = "cancelled"
            for c in choices:
                await c.gen.cancel()
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        finally:
            self.metrics.in_flight.dec()
            self._active -= 1
            if any(c.error for c in choices) and status == "ok":
                status = "error"
            self.metrics.requests.labels(creq.model, endpoint, status).inc()
            ctx.update(
                outcome=status,
                completion_tokens=sum(len(c.gen.generated) for c in choices),
                cached_tokens=choices[0].gen.cached_tokens if choices else 0,
                worker_id=",".join(c.gen.worker_id for c in choices),
                attempts=max((c.gen.attempts for c in choices), default=0),
            )
            await self._observe(creq.model, choices, accepted, prompt_len, status)

    @staticmethod
    def _choice_output(card: Any, params: GenerationParams, chat: bool) -> ChoiceOutput:
        if not chat:
            return ChoiceOutput()
        try:
            return ChoiceOutput(
                params.tools,
                card.tool_call_parser,
                card.reasoning_parser,
                constrained=params.structured is not None,
            )
        except ValueError as exc:
            raise OpenAIError(400, str(exc), param="tool_choice") from None

    def _check_constraint(self, model: str, params: GenerationParams) -> None:
        """A constraint the model's engines cannot honour is a 400 naming the engine."""
        if params.structured is None:
            return
        engines = {
            v.reg.engine for v in self.discovery.state.workers.values() if v.reg.model == model
        }
        if engines == {"mocker"}:
            why = mocker_problem(params.structured)
            if why is not None:
                raise OpenAIError(
                    400,
                    f"the mocker engine serving this model cannot honour this constraint: {why}",
                    param="response_format",
                )

    @staticmethod
    def _prompt_embeds(served: ServedModel, creq: CompletionRequest) -> tuple[bytes, int]:
        """The tensor's bytes and positions, checked against the model (400s otherwise)."""
        card = served.card
        if "prompt_embeds" not in card.tasks:
            raise OpenAIError(
                400,
                f"The model `{card.name}` takes no prompt_embeds: its workers are not vLLM "
                "workers started with --vllm-arg enable_prompt_embeds=true.",
                param="prompt_embeds",
            )
        try:
            data, header = decode_prompt_embeds(creq.prompt_embeds_value() or "")
        except PromptEmbedsError as exc:
            raise OpenAIError(400, str(exc), param="prompt_embeds") from None
        if len(header.shape) != 2 or header.shape[0] < 1:
            raise OpenAIError(
                400,
                f"prompt_embeds must be 2-D (positions x hidden size), got shape {header.shape}",
                param="prompt_embeds",
            )
        if card.hidden_size and header.shape[1] != card.hidden_size:
            raise OpenAIError(
                400,
                f"prompt_embeds has {header.shape[1]} columns; this model's hidden size is "
                f"{card.hidden_size}",
                param="prompt_embeds",
            )
        return data, header.shape[0]

    @staticmethod
    def _echo_text(served: ServedModel, creq: Any, prompt: list[int]) -> str:
        value = creq.prompt_value()
        return value if isinstance(value, str) else served.tokenizer.decode(prompt, False)

    async def _prompt_tokens(
        self,
        served: ServedModel,
        creq: Any,
        chat: bool,
        size_hint: int,
        params: GenerationParams,
    ) -> list[int]:
        tok = served.tokenizer
        param = "messages" if chat else "prompt"
        render: Callable[[], str]
        if chat:
            messages = creq.messages_as_dicts()
            extra = creq.template_kwargs()
            tools = params.tools.template_tools() if params.tools is not None else None
            if tools:
                extra["tools"] = tools

            def render() -> str:
                return tok.apply_chat_template(messages, add_generation_prompt=True, **extra)
        else:
            prompt = creq.prompt_value()
            if not isinstance(prompt, str):
                if any(t < 0 or t >= tok.vocab_size for t in prompt):
                    raise OpenAIError(
                        400, "prompt contains token ids outside the vocabulary", param="prompt"
                    )
                return list(prompt)
            text: str = prompt

            def render() -> str:
                return text

        ctx = served.card.context_length
        try:
            return await self.tokenizer.tokenize(
                creq.model, tok, render, ctx, size_hint, idle=self._active == 0
            )
        except PromptTooLong as exc:
            raise context_length_exceeded(
                ctx, f"your {param} resulted in at least {exc.at_least} tokens", param, param
            ) from None
        except ValueError as exc:
            if isinstance(exc, OpenAIError):
                raise
            raise OpenAIError(400, str(exc), param=param) from None

    async def _start(
        self,
        model: str,
        rid: str,
        prompt: list[int],
        params: GenerationParams,
        max_tokens: int,
        block_size: int,
        traceparent: str,
        skip_special_tokens: bool = True,
        prompt_embeds: bytes | None = None,
    ) -> list[AnyGeneration]:
        now = time.time()
        requests = [
            Request(
                request_id=rid if params.n == 1 else f"{rid}-{i}",
                model=model,
                token_ids=tuple(prompt),
                sampling=SamplingParams(
                    max_tokens=max_tokens,
                    temperature=params.temperature,
                    top_p=params.top_p,
                    seed=None if params.seed is None else params.seed + i,
                    ignore_eos=params.ignore_eos,
                    min_tokens=params.min_tokens,
                    top_k=params.top_k,
                    min_p=params.min_p,
                    presence_penalty=params.presence_penalty,
                    frequency_penalty=params.frequency_penalty,
                    repetition_penalty=params.repetition_penalty,
                    logprobs=params.logprobs,
                    prompt_logprobs=params.prompt_logprobs,
                    structured=params.structured,
                ),
                created_at_s=now,
                skip_special_tokens=skip_special_tokens,
                prompt_embeds=prompt_embeds,
            )
            for i in range(params.n)
        ]
        return await self._submit(model, rid, requests, block_size, traceparent)

    async def _submit(
        self, model: str, rid: str, requests: list[Request], block_size: int, traceparent: str
    ) -> list[AnyGeneration]:
        """Route and publish every request, or none (503 when the fleet cannot take them)."""
        gens: list[AnyGeneration] = []
        try:
            for request in requests:
                gen = await self.client.generate(request, traceparent)
                if gen.decision is not None:
                    self.metrics.observe_route(gen.decision, len(request.token_ids), block_size)
                gens.append(gen)
        except (NoWorkersError, OverloadedError) as exc:
            for g in gens:
                await g.cancel("shed")
            self.metrics.shed.labels(model).inc()
            await self._observe_shed(rid, model, len(requests[0].token_ids))
            raise OpenAIError(
                503,
                str(exc),
                type="service_unavailable",
                code="overloaded" if isinstance(exc, OverloadedError) else "no_workers",
            ) from None
        except Exception as exc:  # NATS or Redis unavailable: nothing was accepted
            for g in gens:
                await g.cancel("routing_failed")
            log.error("routing_failed", model=model, error=str(exc))
            raise OpenAIError(
                503,
                f"routing unavailable: {exc}",
                type="service_unavailable",
                code="routing_unavailable",
            ) from None
        return gens

    async def _chunks(self, choices: list[_Choice], lp: _Logprobs | None) -> Any:
        """``_choice_chunks`` items in arrival order across all choices."""
        if len(choices) == 1:
            async for item in self._choice_chunks(0, choices[0], lp):
                yield item
            return
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def pump(i: int, c: _Choice) -> None:
            try:
                async for item in self._choice_chunks(i, c, lp):
                    queue.put_nowait(item)
            finally:
                queue.put_nowait(None)

        tasks = [asyncio.create_task(pump(i, c)) for i, c in enumerate(choices)]
        try:
            remaining = len(tasks)
            while remaining:
                item = await queue.get()
                if item is None:
                    remaining -= 1
                else:
                    yield item
        finally:
            for t in tasks:
                t.cancel()

    async def _choice_chunks(self, i: int, c: _Choice, lp: _Logprobs | None) -> Any:
        """(choice index, Delta, finish_reason, logprobs of the chunk's tokens) per chunk."""
        async for chunk in c.gen:
            now = time.monotonic()
            if chunk.token_ids:
                if not c.first_at:
                    c.first_at = now
                else:  # inter-token latency, per token: a chunk's gap spread over its tokens
                    n = len(chunk.token_ids)
                    gap = (now - c.last_at) / n
                    itl = self.metrics.itl.labels(c.gen.request.model)
                    for _ in range(n):
                        itl.observe(gap)
                c.last_at = now
            text = c.stops.feed(chunk.text)
            reason = chunk.finish_reason
            if c.stops.stopped:
                reason = "stop"
                await c.gen.cancel("stop_string")
            elif reason is not None:
                text += c.stops.flush()
                if reason == "error":
                    c.error = chunk.error or "generation failed"
                elif reason == "abort":
                    c.error = "generation aborted by the worker"
                    reason = "error"
            delta = c.out.feed(text)
            if reason is not None and reason != "error":
                tail, reason = c.out.finish(reason)
                delta = Delta(
                    delta.content + tail.content, delta.reasoning + tail.reasoning, tail.tool_calls
                )
            if c.echo is not None and not c.echo_done:
                c.echo_done = True
                delta.content = c.echo + delta.content
            logprobs = self._chunk_logprobs(c, chunk, lp) if lp is not None else None
            if delta.content:
                c.text.append(delta.content)
            if delta.reasoning:
                c.reasoning.append(delta.reasoning)
            c.calls.extend(delta.tool_calls)
            if reason is not None:
                c.reason = reason
            yield i, delta, reason, logprobs
            if reason is not None:
                return

    def _chunk_logprobs(self, c: _Choice, chunk: Any, lp: _Logprobs) -> Any:
        """This chunk's logprobs in the endpoint's shape (kept for the whole response too)."""
        ids, values = chunk.token_ids, chunk.logprobs or ()
        if lp.chat:
            entries = chat_content(lp.token_text, ids, values, lp.k or 0)
            c.logprobs.extend(entries)
            return entries
        if not c.logprobs:
            c.logprobs.append(CompletionLogprobs(lp.token_text, lp.k or 0))
        acc: CompletionLogprobs = c.logprobs[0]
        parts = []
        if lp.echo_k is not None and len(c.logprobs) == 1:  # the prompt first, once
            prompt = c.gen.request.token_ids[: c.gen.prompt_len]
            parts.append(acc.add(prompt, chunk.prompt_logprobs or (None,) * len(prompt)))
        if lp.k is not None:
            parts.append(acc.add(ids, values))
        merged = merge_completion(parts) or {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        c.logprobs.append(merged)
        return merged

    async def _stream(
        self,
        send: asgi.Send,
        shape: Shape,
        choices: list[_Choice],
        include_usage: bool,
        prompt_len: int,
        lp: _Logprobs | None,
    ) -> None:
        await asgi.start_sse(send)
        head = shape.start(len(choices))
        if head:
            await asgi.send_sse(send, head)
        pending: list[bytes] = []  # events already here go out in one write
        async for i, delta, reason, logprobs in self._chunks(choices, lp):
            if reason == "error":
                err = OpenAIError(500, choices[i].error or "generation failed", type="server_error")
                pending.append(shape.error(err))
            elif delta or reason is not None or logprobs:
                if reason is not None:
                    shape.finish(reason, choices[i].stops.matched)
                pending.append(shape.delta_chunk(i, delta, reason, logprobs))
            if pending and not any(c.gen.pending for c in choices):
                await asgi.send_sse(send, b"".join(pending))
                pending.clear()
        if pending:
            await asgi.send_sse(send, b"".join(pending))
        await asgi.end_sse(send, shape.end(self._usage(choices, prompt_len), include_usage))

    async def _collect(
        self,
        send: asgi.Send,
        shape: Shape,
        choices: list[_Choice],
        prompt_len: int,
        lp: _Logprobs | None,
    ) -> None:
        async for _ in self._chunks(choices, lp):
            pass
        failed = [c.error for c in choices if c.error]
        if failed:
            err = OpenAIError(500, failed[0], type="server_error")
            await asgi.send_json(send, 500, shape.error_json(err))
            return
        shape.finish(choices[0].reason, choices[0].stops.matched)
        full = [
            FullChoice(
                "".join(c.text),
                c.reason,
                "".join(c.reasoning),
                c.calls,
                _full_logprobs(c, lp),
            )
            for c in choices
        ]
        await asgi.send_json(send, 200, shape.full(full, self._usage(choices, prompt_len)))

    @staticmethod
    def _usage(choices: list[_Choice], prompt_len: int) -> dict[str, Any]:
        completion = sum(len(c.gen.generated) for c in choices)
        cached = max((c.gen.cached_tokens for c in choices), default=0)
        return usage_body(prompt_len, completion, cached)

    async def _observe_shed(self, rid: str, model: str, prompt_len: int) -> None:
        """A request turned away is demand too: the planner counts it (scale from zero)."""
        obs = RequestObservation(
            request_id=rid,
            model=model,
            status="shed",
            ts_s=time.time(),
            isl_tokens=prompt_len,
            frontend_id=self.frontend_id,
        )
        with contextlib.suppress(Exception):
            await self.nc.publish(self.subjects.obs(model), wire_encode(obs))

    async def _observe(
        self, model: str, choices: list[_Choice], accepted: float, prompt_len: int, status: str
    ) -> None:
        for c in choices:
            gen = c.gen
            osl = len(gen.generated)
            end = c.last_at or time.monotonic()
            ttft = (c.first_at - accepted) if c.first_at else 0.0
            if c.first_at:
                self.metrics.ttft.labels(model).observe(ttft)
            self.metrics.duration.labels(model).observe(end - accepted)
            self.metrics.isl.labels(model).observe(prompt_len)
            self.metrics.osl.labels(model).observe(osl)
            self.metrics.tokens.labels(model, "prompt").inc(prompt_len)
            self.metrics.tokens.labels(model, "completion").inc(osl)
            self.metrics.tokens.labels(model, "cached").inc(gen.cached_tokens)
            if gen.host_cached_tokens:
                self.metrics.tokens.labels(model, "cached_host").inc(gen.host_cached_tokens)
            if gen.attempts > 1:
                self.metrics.migrations.labels(model).inc(gen.attempts - 1)
            obs = observation(
                gen,
                status="error" if c.error else status,
                accepted=accepted,
                first_at=c.first_at,
                last_at=c.last_at,
                source=self.frontend_id,
                finish_reason=c.reason,
                error=c.error,
            )
            if obs.kv_transfer_ms:
                self.metrics.kv_transfer.labels(model).observe(obs.kv_transfer_ms / 1000)
            await self._publish_observation(model, obs)

    async def _publish_observation(self, model: str, obs: RequestObservation) -> None:
        try:
            await self.nc.publish(self.subjects.obs(model), wire_encode(obs))
        except Exception as exc:
            log.warning("observation_publish_failed", request_id=obs.request_id, error=str(exc))


def _input_too_long(context: int, tokens: int) -> OpenAIError:
    return context_length_exceeded(context, f"an input has {tokens} tokens", "input", "input")


Shape = ChatShape | MessagesShape | ResponsesShape


def _shape(endpoint: str, rid: str, model: str, original: dict[str, Any], prompt_len: int) -> Shape:
    created = int(time.time())
    if endpoint == "messages":
        shape = MessagesShape(rid, created, model)
        shape.prompt_tokens = prompt_len
        return shape
    if endpoint == "responses":
        return ResponsesShape(rid, created, model, original)
    return (ChatShape if endpoint == "chat" else CompletionShape)(rid, created, model)


def _full_logprobs(c: _Choice, lp: _Logprobs | None) -> Any:
    if lp is None:
        return None
    if lp.chat:
        return c.logprobs
    return merge_completion(c.logprobs[1:]) if c.logprobs else None


async def _lifespan(receive: asgi.Receive, send: asgi.Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
