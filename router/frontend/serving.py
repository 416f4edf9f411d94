"""The generation path every API family shares: a parsed request in, its response out.

    body -> typed request (the family's module) -> GenerationParams
         -> prompt tokens (prompts.py) -> budget (resolve_max_tokens)
         -> one engine Request per choice -> generations (submit: routed and published, or 503)
         -> the response, streamed or whole (stream.py, through the family's ResponseShape)
         -> metrics and observations (observe.py)

An accepted request ends in a full response, a complete SSE stream, or a clear error (in the
stream when streaming has begun). A client that disconnects cancels its generations on the
workers. When the fleet cannot take every choice, none is sent: 503 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec
import structlog

from model.structured import problem as instance_problem
from router.client import FleetClient
from router.discovery import Discovery, ServedModel
from router.frontend import asgi
from router.frontend.errors import OpenAIError, bad
from router.frontend.metrics import FrontendMetrics
from router.frontend.observe import Observer
from router.frontend.openai_protocol import ChatCompletionRequest, CompletionRequest
from router.frontend.output import ChoiceOutput
from router.frontend.params import GenerationParams, resolve_max_tokens
from router.frontend.prompts import Prompts
from router.frontend.shapes import ResponseShape
from router.frontend.stops import StopMatcher
from router.frontend.stream import AnyGeneration, Choice, Choices, LogprobsAsk
from router.frontend.tokenize import PromptTokenizer
from router.generation import NoWorkersError, OverloadedError
from schemas import ModelCard, Request

log = structlog.get_logger("jetfleet.frontend")

ShapeFor = Callable[[str, int], ResponseShape]  # (response id, prompt tokens) -> the shape
OnRequests = Callable[[list[Request]], Awaitable[None]]


@dataclass(frozen=True)
class Prompt:
    tokens: list[int]
    length: int  # positions: the tokens', or the prompt embeddings' (which have no tokens)
    embeds: bytes | None = None  # prompt_embeds, as sent


@dataclass(frozen=True)
class Endpoint:
    name: str  # the metrics' endpoint label: chat | completions | responses | messages
    id_prefix: str  # of the response id: chatcmpl | cmpl | resp | msg
    chat: bool  # a chat prompt (messages through the template); else a completion prompt


class Serving:
    def __init__(
        self,
        discovery: Discovery,
        client: FleetClient,
        metrics: FrontendMetrics,
        tokenizer: PromptTokenizer,
        observer: Observer,
    ) -> None:
        self.discovery = discovery
        self.client = client
        self.metrics = metrics
        self.observer = observer
        self.active = 0  # generation requests in progress in this process
        # hears each interactive request's (not a Batch API line's) acceptance and first token
        self.on_first_token: Callable[[float, float], None] | None = None
        # an idle frontend tokenizes small prompts inline (tokenize.py)
        self.prompts = Prompts(tokenizer, idle=lambda: self.active == 0)

    def resolve(self, name: str) -> tuple[str, str | None]:
        """The model a request's ``model`` names, and the LoRA adapter when it names one that a
        live worker has loaded (vLLM's convention): an adapter runs on its base model, on the
        workers that hold it. A model's own name wins over an adapter's."""
        if name not in self.discovery.models:
            base = self.discovery.state.adapters().get(name)
            if base is not None:
                return base, name
        return name, None

    def served(self, model: str) -> ServedModel:
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

    async def generate(
        self,
        call: asgi.Call,
        endpoint: Endpoint,
        creq: ChatCompletionRequest | CompletionRequest,
        params: GenerationParams,
        shape_for: ShapeFor,
        size_hint: int,
        on_requests: OnRequests | None = None,
    ) -> None:
        """``on_requests``: hears the engine requests before they are sent (a background
        response keeps them, so another frontend can take it over)."""
        accepted = time.monotonic()
        model, lora = self.resolve(creq.model)
        served = self.served(model)
        call.ctx["model"] = creq.model  # a served model or adapter: a bounded label value
        card = served.card
        outputs = [_choice_output(card, params, endpoint.chat) for _ in range(params.n)]
        self._check_constraint(model, params)
        prompt = await self._prompt(served, creq, params, size_hint)
        max_tokens = resolve_max_tokens(
            params.max_tokens,
            prompt.length,
            card.context_length,
            prompt_param="messages" if endpoint.chat else "prompt",
        )
        rid = f"{endpoint.id_prefix}-{call.ctx['request_id']}"
        call.ctx.update(request_id=rid, model=creq.model, prompt_tokens=prompt.length)
        special = served.tokenizer.special_tokens
        keep_special = any(m in special for o in outputs[:1] for m in o.markers)
        requests = _requests(model, lora, rid, prompt, params, max_tokens, keep_special)
        if call.ctx.get("priority"):  # a Batch API line: after interactive requests
            requests = [msgspec.structs.replace(r, priority=call.ctx["priority"]) for r in requests]
        if on_requests is not None:
            await on_requests(requests)
        gens = await self.submit(model, rid, requests, card.block_size, call.traceparent)
        echo = None
        if params.echo and isinstance(creq, CompletionRequest):
            echo = self.prompts.echo_text(served, creq, prompt.tokens)
        choices = [
            Choice(g, StopMatcher(params.stop), o, echo=echo)
            for g, o in zip(gens, outputs, strict=True)
        ]
        run = self._choices(choices, served, endpoint, creq.model, params, prompt.length)
        shape = shape_for(rid, prompt.length)
        await self._run(call, endpoint, creq.model, run, params, shape, accepted)

    async def resume(
        self,
        call: asgi.Call,
        endpoint: Endpoint,
        creq: ChatCompletionRequest,
        params: GenerationParams,
        shape: ResponseShape,
        gen: AnyGeneration,
    ) -> None:
        """Run a request another frontend started (``gen``: its generation as taken over, from
        its first chunk): its one choice through the same output path as ``generate``."""
        model, _lora = self.resolve(creq.model)
        served = self.served(model)
        call.ctx.update(request_id=gen.request_id, model=creq.model, prompt_tokens=gen.prompt_len)
        choice = Choice(gen, StopMatcher(params.stop), _choice_output(served.card, params, True))
        run = self._choices([choice], served, endpoint, creq.model, params, gen.prompt_len)
        await self._run(call, endpoint, creq.model, run, params, shape, time.monotonic())

    def _choices(
        self,
        choices: list[Choice],
        served: ServedModel,
        endpoint: Endpoint,
        label: str,
        params: GenerationParams,
        prompt_len: int,
    ) -> Choices:
        lp = None
        sampling = params.sampling
        if sampling.logprobs is not None or sampling.prompt_logprobs is not None:
            lp = LogprobsAsk(
                sampling.logprobs, sampling.prompt_logprobs, endpoint.chat, served.token_text
            )
        return Choices(choices, prompt_len, lp, self.metrics.itl_observer(label))

    async def _prompt(
        self,
        served: ServedModel,
        creq: ChatCompletionRequest | CompletionRequest,
        params: GenerationParams,
        size_hint: int,
    ) -> Prompt:
        if isinstance(creq, ChatCompletionRequest):
            tokens = await self.prompts.chat(served, creq, params, size_hint)
        elif creq.prompt_embeds is not None:
            embeds, positions = self.prompts.embeds(served, creq)
            return Prompt([], positions, embeds)
        else:
            tokens = await self.prompts.completion(served, creq, size_hint)
        return Prompt(tokens, len(tokens))

    async def _run(
        self,
        call: asgi.Call,
        endpoint: Endpoint,
        model: str,
        run: Choices,
        params: GenerationParams,
        shape: ResponseShape,
        accepted: float,
    ) -> None:
        self.metrics.in_flight.inc()
        self.active += 1
        status = "ok"
        choices = run.choices
        try:
            async with asgi.DisconnectWatcher(call.receive):
                if params.stream:
                    await run.stream(call.send, shape, params.include_usage)
                else:
                    await run.collect(call.send, shape)
        except asyncio.CancelledError:
            status = "cancelled"
            handed_over = bool(call.ctx.get("handed_over"))  # another frontend runs it on
            for c in choices:
                await c.gen.cancel(stop_worker=not handed_over)
            asgi.settle_cancellation()
        finally:
            self.metrics.in_flight.dec()
            self.active -= 1
            if any(c.error for c in choices) and status == "ok":
                status = "error"
            self.metrics.requests.labels(model, endpoint.name, status).inc()
            call.ctx.update(
                outcome=status,
                completion_tokens=sum(len(c.gen.generated) for c in choices),
                cached_tokens=choices[0].gen.cached_tokens if choices else 0,
                worker_id=",".join(c.gen.worker_id for c in choices),
                attempts=max((c.gen.attempts for c in choices), default=0),
            )
            if self.on_first_token is not None and not call.ctx.get("priority"):
                for c in choices:
                    if c.first_at:
                        self.on_first_token(accepted, c.first_at)
            await self.observer.generated(model, choices, accepted, run.prompt_len, status)

    async def submit(
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
            await self.observer.shed(rid, model, len(requests[0].token_ids))
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

    def _check_constraint(self, model: str, params: GenerationParams) -> None:
        """A constraint the model's workers cannot honour is a 400 naming the engine: when
        they all write instances (``WorkerRegistration.structured``), one outside the subset
        ``model.structured`` satisfies."""
        if params.sampling.structured is None:
            return
        regs = [v.reg for v in self.discovery.state.workers.values() if v.reg.model == model]
        if regs and all(r.structured == "instances" for r in regs):
            why = instance_problem(params.sampling.structured)
            if why is not None:
                engines = ", ".join(sorted({r.engine for r in regs}))
                message = f"the {engines} engine serving this model cannot honour this constraint"
                raise bad("response_format", f"{message}: {why}")


def _choice_output(card: ModelCard, params: GenerationParams, chat: bool) -> ChoiceOutput:
    if not chat:
        return ChoiceOutput()
    try:
        return ChoiceOutput(
            params.tools,
            card.tool_call_parser,
            card.reasoning_parser,
            constrained=params.sampling.structured is not None,
        )
    except ValueError as exc:
        raise bad("tool_choice", str(exc)) from None


def _requests(
    model: str,
    lora: str | None,
    rid: str,
    prompt: Prompt,
    params: GenerationParams,
    max_tokens: int,
    keep_special: bool,
) -> list[Request]:
    """One engine request per choice (``rid-i`` when there are several)."""
    now = time.time()
    return [
        Request(
            request_id=rid if params.n == 1 else f"{rid}-{i}",
            model=model,
            lora_name=lora,
            token_ids=tuple(prompt.tokens),
            sampling=params.choice_sampling(max_tokens, i),
            created_at_s=now,
            skip_special_tokens=not keep_special,
            prompt_embeds=prompt.embeds,
        )
        for i in range(params.n)
    ]
