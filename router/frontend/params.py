"""What an OpenAI request asks the engine to do, defaults resolved: ``GenerationParams``. Pure.

The engine's part is a ``SamplingParams`` (the wire struct each choice's ``Request`` carries);
the frontend's own part (choices, stop strings, streaming, echo, tools) sits beside it. The
structured-output constraint comes as OpenAI's ``response_format`` (``json_object``,
``json_schema``) or as vLLM's extras (``guided_json``, ``guided_regex``, ``guided_choice``,
``guided_grammar``, ``structured_outputs``), at most one per request; a tool choice that forces
a call is a constraint too. ``resolve_max_tokens`` sets the budget once the prompt is tokenized.

Each request's parameters are made once, by the parse that checks it: ``parse_chat``,
``parse_completion``, or ``checked_chat`` for a chat request translated from another API (the
tools, the tool choice and the constraint are checked in making them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgspec

from router.frontend.errors import bad, context_length_exceeded
from router.frontend.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    _Common,
    check_chat_request,
    parse_chat_request,
    parse_completion_request,
    stops,
)
from router.frontend.tools import ToolChoiceError, ToolPlan, plan_tools
from schemas import SamplingParams, StructuredOutput


@dataclass(frozen=True)
class GenerationParams:
    """What the engine is asked to do, defaults resolved."""

    sampling: SamplingParams
    """As the first choice's ``Request`` carries it (``choice_sampling``), but for ``max_tokens``:
    the request's own, 0 when it gave none (up to the context length: ``resolve_max_tokens``)."""
    n: int  # choices per request
    stop: tuple[str, ...]  # stop strings, applied by the frontend
    stream: bool
    include_usage: bool  # final usage chunk when streaming
    echo: bool = False  # completions: the prompt before the completion
    tools: ToolPlan | None = None

    @property
    def max_tokens(self) -> int | None:
        """The budget the request asked for (None: what the context leaves)."""
        return self.sampling.max_tokens or None

    def choice_sampling(self, max_tokens: int, choice: int) -> SamplingParams:
        """Choice ``choice``'s sampling: the resolved budget; with a seed, seed + choice."""
        seed = self.sampling.seed
        return msgspec.structs.replace(
            self.sampling, max_tokens=max_tokens, seed=None if seed is None else seed + choice
        )


def chat_max_tokens(req: ChatCompletionRequest) -> int | None:
    return req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens


def chat_generation_params(req: ChatCompletionRequest) -> GenerationParams:
    plan = _tool_plan(req)
    structured = _structured(req)
    tool_constraint = plan.constraint()
    if tool_constraint is not None:
        if structured is not None:
            raise bad(
                "response_format",
                "response_format cannot be combined with tool_choice "
                f"'{plan.mode}' (the call is the constrained output)",
            )
        structured = tool_constraint
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    return _params(req, chat_max_tokens(req), logprobs=logprobs, structured=structured, tools=plan)


def completion_generation_params(req: CompletionRequest) -> GenerationParams:
    echo = bool(req.echo)
    return _params(
        req,
        req.max_tokens,
        logprobs=req.logprobs,
        prompt_logprobs=req.logprobs if echo else None,
        echo=echo,
        structured=_structured(req),
    )


def _tool_plan(req: ChatCompletionRequest) -> ToolPlan:
    try:
        return plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls)
    except ToolChoiceError as exc:
        raise bad(exc.param, str(exc)) from None


def _structured(req: _Common) -> StructuredOutput | None:
    """The one constraint the request sets (``response_format`` or a vLLM extra), or None."""
    found: list[tuple[str, StructuredOutput]] = []
    rf = req.response_format
    if rf is not None:
        kind = rf.get("type") if isinstance(rf, dict) else None
        if kind == "json_object":
            found.append(("response_format", StructuredOutput(json_object=True)))
        elif kind == "json_schema":
            spec = rf.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise bad(
                    "response_format.json_schema.schema", "json_schema needs a 'schema' object"
                )
            found.append(("response_format", StructuredOutput(json_schema=json.dumps(schema))))
        elif kind != "text":
            raise bad(
                "response_format.type",
                "response_format.type must be 'text', 'json_object' or 'json_schema'",
            )
    if req.guided_json is not None:
        found.append(("guided_json", StructuredOutput(json_schema=_schema_text(req.guided_json))))
    if req.guided_regex is not None:
        found.append(("guided_regex", StructuredOutput(regex=req.guided_regex)))
    if req.guided_choice is not None:
        found.append(("guided_choice", _choice(req.guided_choice, "guided_choice")))
    if req.guided_grammar is not None:
        found.append(("guided_grammar", StructuredOutput(grammar=req.guided_grammar)))
    if req.structured_outputs:
        found.append(("structured_outputs", _vllm_structured(req.structured_outputs)))
    if len(found) > 1:
        raise bad(found[1][0], f"only one of {', '.join(n for n, _ in found)} may be set")
    return found[0][1] if found else None


def _schema_text(schema: Any, param: str = "guided_json") -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise bad(param, f"{param} is not valid JSON") from None
    if not isinstance(schema, dict):
        raise bad(param, f"{param} must be a JSON schema object")
    return json.dumps(schema)


def _choice(options: Any, param: str) -> StructuredOutput:
    if not isinstance(options, list) or not options:
        raise bad(param, f"{param} must be a non-empty list of strings")
    if not all(isinstance(o, str) and o for o in options):
        raise bad(param, f"{param} must hold non-empty strings")
    return StructuredOutput(choice=tuple(options))


def _vllm_structured(spec: dict[str, Any]) -> StructuredOutput:
    keys = [k for k in ("json", "regex", "choice", "grammar", "json_object") if spec.get(k)]
    if len(keys) != 1:
        raise bad(
            "structured_outputs",
            "structured_outputs must set exactly one of json, regex, choice, grammar, json_object",
        )
    key, value = keys[0], spec[keys[0]]
    param = f"structured_outputs.{key}"
    if key == "json":
        return StructuredOutput(json_schema=_schema_text(value, param))
    if key == "choice":
        return _choice(value, param)
    if key == "json_object":
        return StructuredOutput(json_object=True)
    if not isinstance(value, str):
        raise bad(param, f"{param} must be a string")
    return StructuredOutput(regex=value) if key == "regex" else StructuredOutput(grammar=value)


def _params(
    req: _Common,
    max_tokens: int | None,
    *,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
    structured: StructuredOutput | None = None,
    echo: bool = False,
    tools: ToolPlan | None = None,
) -> GenerationParams:
    sampling = SamplingParams(
        max_tokens=max_tokens or 0,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        seed=req.seed,
        ignore_eos=bool(req.ignore_eos),
        min_tokens=req.min_tokens or 0,
        top_k=max(req.top_k or 0, 0),
        min_p=req.min_p or 0.0,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        structured=structured,
    )
    return GenerationParams(
        sampling,
        n=req.n or 1,
        stop=stops(req.stop),
        stream=bool(req.stream),
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        echo=echo,
        tools=tools,
    )


def resolve_max_tokens(
    requested: int | None, prompt_len: int, context_length: int, prompt_param: str = "messages"
) -> int:
    """Completion budget: ``requested``, or what the context leaves; 400 if it does not fit."""
    if prompt_len < context_length and (
        requested is None or prompt_len + requested <= context_length
    ):
        return requested if requested is not None else context_length - prompt_len
    completion = requested or 0
    raise context_length_exceeded(
        context_length,
        f"you requested {prompt_len + completion} tokens ({prompt_len} in the messages, "
        f"{completion} in the completion)",
        "messages or completion",
        prompt_param if requested is None or prompt_len >= context_length else "max_tokens",
    )


def parse_chat(body: bytes) -> tuple[ChatCompletionRequest, GenerationParams]:
    """A ``/v1/chat/completions`` body: the request, checked, and its parameters."""
    req = parse_chat_request(body)
    return req, chat_generation_params(req)


def checked_chat(req: ChatCompletionRequest) -> tuple[ChatCompletionRequest, GenerationParams]:
    """A chat request translated from another API's body, checked, and its parameters."""
    req = check_chat_request(req)
    return req, chat_generation_params(req)


def parse_completion(body: bytes) -> tuple[CompletionRequest, GenerationParams]:
    """A ``/v1/completions`` body: the request, checked, and its parameters."""
    req = parse_completion_request(body)
    return req, completion_generation_params(req)
