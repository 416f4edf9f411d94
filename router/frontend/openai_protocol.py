"""OpenAI request bodies (chat completions, completions): typed structs and their validation.

Parsing is typed (msgspec, ``errors.decode_body``): a wrong type names the field. Ranges are
checked after parsing. Every failure is an ``OpenAIError`` (``errors.py``). Unknown fields are
ignored, as vLLM's server does (OpenAI's own refuses them); known fields the fleet cannot honour
(``logit_bias``, ``best_of``, ``suffix``, non-text content parts, audio output, ``prediction``,
``web_search_options``) are refused with 400 when set to anything but their default, never
silently ignored. Most optional fields also accept ``null`` (some clients send every field).

No HTTP code here, and nothing of ``params.py``: the frontend parses through ``params.py``
(``parse_chat``, ``parse_completion``, ``checked_chat``), which checks a request here and makes
its ``GenerationParams`` once; the tools, the tool choice and the structured-output constraint
are checked in making them.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec

from router.frontend.errors import bad, decode_body, refuse

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


# ---- parsing and validation ------------------------------------------------------------------

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")
_chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)


def parse_chat_request(body: bytes) -> ChatCompletionRequest:
    """Decode and validate a ``/v1/chat/completions`` body."""
    return check_chat_request(decode_body(body, _chat_decoder))


def check_chat_request(req: ChatCompletionRequest) -> ChatCompletionRequest:
    """Validate a chat request, decoded or translated from another API's body."""
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


def stops(stop: str | list[str] | None) -> tuple[str, ...]:
    """The ``stop`` field as a tuple of strings."""
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def _check_stop(stop: str | list[str] | None) -> None:
    given = stops(stop)
    if len(given) > MAX_STOP:
        raise bad("stop", f"stop may hold at most {MAX_STOP} strings, got {len(given)}")
    if any(not s for s in given):
        raise bad("stop", "stop strings must be non-empty")
