"""OpenAI request bodies (chat completions, completions): typed structs, validation, and the
parameters they resolve to.

Parsing is typed (msgspec, ``errors.decode_body``): a wrong type names the field. Ranges are
checked after parsing. Every failure is an ``OpenAIError`` (``errors.py``). Unknown fields are
ignored, as vLLM's server does (OpenAI's own refuses them); known fields the fleet cannot honour
(``logit_bias``, ``best_of``, ``suffix``, non-text content parts, audio output, ``prediction``,
``web_search_options``) are refused with 400 when set to anything but their default, never
silently ignored. Most optional fields also accept ``null`` (some clients send every field).

Structured output comes as OpenAI's ``response_format`` (``json_object``, ``json_schema``) or as
vLLM's extras (``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar``,
``structured_outputs``); at most one constraint per request.

No HTTP code here: the frontend calls ``parse_*_request`` then ``*_generation_params``, and
``resolve_max_tokens`` once the prompt is tokenized.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from router.frontend.errors import bad, context_length_exceeded, decode_body, refuse
from router.frontend.tools import ToolChoiceError, ToolPlan, plan_tools
from schemas.requests import StructuredOutput

_INT64 = 2**63
MAX_N = 16
MAX_STOP = 4
MAX_LOGPROBS = 20


# ---- request structs -------------------------------------------------------------------------


class TextPart(msgspec.Struct):
    type: str  # only "text" is served
    text: str = ""


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str = "{}"  # JSON text, as OpenAI sends it


class ToolCall(msgspec.Struct):
    function: FunctionCall
    id: str = ""
    type: str = "function"


class ChatMessage(msgspec.Struct):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None  # None only for assistant messages
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant messages that called tools
    reasoning_content: str | None = None  # an earlier answer's reasoning (templates may use it)


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = None


class _Common(msgspec.Struct):
    model: str
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    temperature: float | None = None  # [0, 2], default 1
    top_p: float | None = None  # (0, 1], default 1
    seed: int | None = None
    n: int | None = None  # [1, 16], default 1
    stream: bool | None = None
    stream_options: StreamOptions | None = None  # only with stream
    ignore_eos: bool | None = None  # vLLM extension
    min_tokens: int | None = None  # vLLM extension, >= 0
    presence_penalty: float | None = None  # [-2, 2]
    frequency_penalty: float | None = None  # [-2, 2]
    top_k: int | None = None  # vLLM extension: -1 or 0 = off, else >= 1
    min_p: float | None = None  # vLLM extension, [0, 1]
    repetition_penalty: float | None = None  # vLLM extension, > 0 (1 = off)
    user: str | None = None
    logit_bias: dict[str, float] | None = None  # refused unless empty
    best_of: int | None = None  # refused unless 1
    response_format: Any = None  # {"type": "text" | "json_object" | "json_schema", ...}
    guided_json: Any = None  # vLLM extension: a JSON schema (object or JSON text)
    guided_regex: str | None = None  # vLLM extension
    guided_choice: list[str] | None = None  # vLLM extension
    guided_grammar: str | None = None  # vLLM extension
    structured_outputs: dict[str, Any] | None = None  # vLLM extension: {json|regex|choice|...}


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = []
    max_completion_tokens: int | None = None  # wins over max_tokens
    logprobs: bool | None = None
    top_logprobs: int | None = None  # [0, 20], needs logprobs
    tools: list[Any] | None = None
    tool_choice: Any = None  # "none" | "auto" | "required" | {"type": "function", ...}
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM extension (enable_thinking, ...)
    reasoning_effort: str | None = None  # to the chat template; "none" also turns thinking off
    modalities: list[str] | None = None  # refused unless ["text"]
    audio: Any = None  # refused (audio output)
    prediction: Any = None  # refused (predicted outputs)
    web_search_options: Any = None  # refused

    def template_kwargs(self) -> dict[str, Any]:
        """What the chat template gets besides the messages: ``chat_template_kwargs`` and,
        from ``reasoning_effort``, ``reasoning_effort`` (gpt-oss-style templates read it) and
        ``enable_thinking`` (Qwen3 / DeepSeek-style ones; "none" turns it off), unless the
        request's ``chat_template_kwargs`` set them itself."""
        extra = dict(self.chat_template_kwargs or {})
        if self.reasoning_effort is not None:
            extra.setdefault("reasoning_effort", self.reasoning_effort)
            extra.setdefault("enable_thinking", self.reasoning_effort != "none")
        return extra

    def messages_as_dicts(self) -> list[dict[str, Any]]:
        """Messages for the chat template: content always a string."""
        return [_message_dict(m) for m in self.messages]


class CompletionRequest(_Common):
    prompt: str | list[Any] | None = None
    logprobs: int | None = None  # [0, 20]: the sampled token's and this many top ones
    echo: bool | None = None  # the prompt before the completion (with its logprobs if asked)
    suffix: str | None = None  # refused unless empty
    prompt_embeds: str | list[str] | None = None  # vLLM extension: base64 torch.save tensor(s)

    def prompt_embeds_value(self) -> str | None:
        """The one base64 tensor of ``prompt_embeds`` (None when unset)."""
        value = self.prompt_embeds
        if isinstance(value, list):
            if len(value) != 1:
                raise bad("prompt_embeds", "prompt_embeds must hold exactly one tensor")
            value = value[0]
        return value

    def prompt_value(self) -> str | list[int]:
        """The single prompt: text or token ids (``OpenAIError`` for batches)."""
        value = _single_prompt(self.prompt)
        if value is None:
            raise bad(
                "prompt",
                "prompt must be a string, a list of token ids, or a list with exactly one of "
                "those (batched prompts are not supported)",
            )
        if not value:
            raise bad("prompt", "prompt must not be empty")
        if isinstance(value, list) and any(t < 0 or t >= _INT64 for t in value):
            raise bad("prompt", "prompt token ids must be non-negative")
        return value


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(type(t) is int for t in value)


def _single_prompt(prompt: Any) -> str | list[int] | None:
    if isinstance(prompt, str) or (_is_token_ids(prompt) and prompt):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1:
        inner = prompt[0]
        if isinstance(inner, str) or _is_token_ids(inner):
            return inner  # type: ignore[no-any-return]
    return None


def _message_dict(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": _content_text(m.content)}
    if m.name is not None:
        out["name"] = m.name
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.reasoning_content is not None:
        out["reasoning_content"] = m.reasoning_content
    if m.tool_calls:
        # arguments as objects: HF chat templates render them with ``tojson`` (as vLLM does)
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": _arguments(c.function)},
            }
            for c in m.tool_calls
        ]
    return out


def _arguments(fn: FunctionCall) -> Any:
    try:
        return json.loads(fn.arguments or "{}")
    except ValueError:
        return fn.arguments


def _content_text(content: str | list[TextPart] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(part.text for part in content)


# ---- resolved parameters ---------------------------------------------------------------------


@dataclass(frozen=True)
class GenerationParams:
    """What the engine is asked to do, defaults resolved."""

    max_tokens: int | None  # None: up to the context length (see resolve_max_tokens)
    temperature: float
    top_p: float
    seed: int | None
    n: int  # choices per request
    stop: tuple[str, ...]  # stop strings, applied by the frontend
    ignore_eos: bool
    min_tokens: int
    top_k: int  # 0 = off
    min_p: float
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    stream: bool
    include_usage: bool  # final usage chunk when streaming
    logprobs: int | None = None  # top-k per generated token; None: not asked
    prompt_logprobs: int | None = None  # completions with echo and logprobs
    echo: bool = False
    structured: StructuredOutput | None = None
    tools: ToolPlan | None = None


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


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def _params(req: _Common, max_tokens: int | None, **extra: Any) -> GenerationParams:
    return GenerationParams(
        max_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        seed=req.seed,
        n=req.n or 1,
        stop=_stops(req.stop),
        ignore_eos=bool(req.ignore_eos),
        min_tokens=req.min_tokens or 0,
        top_k=max(req.top_k or 0, 0),
        min_p=req.min_p or 0.0,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        stream=bool(req.stream),
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        **extra,
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


# ---- parsing and validation ------------------------------------------------------------------

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")
_chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)


def parse_chat_request(body: bytes) -> ChatCompletionRequest:
    """Decode and validate a ``/v1/chat/completions`` body."""
    req = decode_body(body, _chat_decoder)
    _check_messages(req.messages)
    _check_common(req)
    _check_max_tokens("max_completion_tokens", req.max_completion_tokens)
    if req.top_logprobs is not None:
        if not 0 <= req.top_logprobs <= MAX_LOGPROBS:
            raise bad("top_logprobs", f"top_logprobs must be in [0, {MAX_LOGPROBS}]")
        if req.top_logprobs and not req.logprobs:
            raise bad("top_logprobs", "top_logprobs needs logprobs set to true")
    if req.reasoning_effort is not None and req.reasoning_effort not in REASONING_EFFORTS:
        raise bad(
            "reasoning_effort", f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}"
        )
    refuse(
        req,
        {
            "modalities": (None, ["text"]),
            "audio": (None,),
            "prediction": (None,),
            "web_search_options": (None,),
        },
    )
    chat_generation_params(req)  # tools, tool_choice and the constraint are checked here
    return req


def parse_completion_request(body: bytes) -> CompletionRequest:
    """Decode and validate a ``/v1/completions`` body."""
    req = decode_body(body, _completion_decoder)
    if req.prompt_embeds is not None:
        req.prompt_embeds_value()
        if req.prompt is not None:
            raise bad("prompt", "send either prompt or prompt_embeds, not both")
        if req.echo:
            raise bad("echo", "echo is not supported with prompt_embeds (there is no text)")
    elif req.prompt is None:
        raise bad("prompt", "Missing required parameter: 'prompt'.")
    else:
        req.prompt_value()
    _check_common(req)
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_LOGPROBS:
        raise bad("logprobs", f"logprobs must be in [0, {MAX_LOGPROBS}]")
    refuse(req, {"suffix": (None, "")})
    completion_generation_params(req)  # the constraint is checked here
    return req


def _check_messages(messages: list[ChatMessage]) -> None:
    if not messages:
        raise bad("messages", "messages must be a non-empty list")
    for i, m in enumerate(messages):
        if m.content is None and m.role != "assistant":
            raise bad(f"messages[{i}].content", f"content is required for role '{m.role}'")
        for j, part in enumerate(m.content if isinstance(m.content, list) else ()):
            if part.type != "text":
                raise bad(
                    f"messages[{i}].content[{j}].type",
                    f"content part type '{part.type}' is not supported (text only)",
                )


def _check_max_tokens(param: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise bad(param, f"{param} must be at least 1, got {value}")


def _check_range(req: _Common, name: str, low: float, high: float, low_open: bool = False) -> None:
    value = getattr(req, name)
    if value is None:
        return
    if value > high or value < low or (low_open and value == low):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise bad(name, f"{name} must be in {interval}, got {value}")


def _check_common(req: _Common) -> None:
    if not req.model:
        raise bad("model", "model must be a non-empty string")
    _check_max_tokens("max_tokens", req.max_tokens)
    _check_range(req, "temperature", 0, 2)
    _check_range(req, "top_p", 0, 1, low_open=True)
    _check_range(req, "n", 1, MAX_N)
    if req.min_tokens is not None and req.min_tokens < 0:
        raise bad("min_tokens", f"min_tokens must be >= 0, got {req.min_tokens}")
    if req.seed is not None and not -_INT64 <= req.seed < _INT64:
        raise bad("seed", "seed must fit in a signed 64-bit integer")
    _check_range(req, "presence_penalty", -2, 2)
    _check_range(req, "frequency_penalty", -2, 2)
    if req.top_k is not None and req.top_k < -1:
        raise bad("top_k", f"top_k must be -1, 0 (off) or at least 1, got {req.top_k}")
    _check_range(req, "min_p", 0, 1)
    if req.repetition_penalty is not None and not req.repetition_penalty > 0:
        raise bad(
            "repetition_penalty",
            f"repetition_penalty must be greater than zero, got {req.repetition_penalty}",
        )
    _check_stop(req.stop)
    if req.stream_options is not None and not req.stream:
        raise bad("stream_options", "stream_options is only allowed when stream is true")
    refuse(req, {"logit_bias": (None, {}), "best_of": (None, 1)})


def _check_stop(stop: str | list[str] | None) -> None:
    stops = _stops(stop)
    if len(stops) > MAX_STOP:
        raise bad("stop", f"stop may hold at most {MAX_STOP} strings, got {len(stops)}")
    if any(not s for s in stops):
        raise bad("stop", "stop strings must be non-empty")
