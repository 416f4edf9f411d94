"""OpenAI request bodies: parsing (msgspec), validation, and OpenAI-style errors.

Parsing is typed (msgspec): a wrong type names the field (``$.temperature`` -> param
``temperature``). Ranges are checked after parsing. Every failure is an ``OpenAIError`` carrying
the HTTP status and the ``{"error": {message, type, param, code}}`` body OpenAI clients expect.
Fields the fleet cannot honour (logprobs, tools, ...) are refused with 400, never ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

_json_encode = msgspec.json.Encoder().encode
_PATH = re.compile(r"\$\.([A-Za-z_]+)")


class OpenAIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> bytes:
        return _json_encode(
            {
                "error": {
                    "message": self.message,
                    "type": self.type,
                    "param": self.param,
                    "code": self.code,
                }
            }
        )


class TextPart(msgspec.Struct):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class _Common(msgspec.Struct):
    model: str
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    user: str | None = None
    logprobs: Any = None
    top_logprobs: Any = None
    logit_bias: Any = None
    response_format: Any = None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = []
    max_completion_tokens: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None

    def messages_as_dicts(self) -> list[dict[str, Any]]:
        return [
            {k: v for k, v in msgspec.to_builtins(m).items() if v is not None}
            | {"content": _content(m.content)}
            for m in self.messages
        ]


class CompletionRequest(_Common):
    prompt: str | list[Any] | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def prompt_value(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, str):
            return p
        if isinstance(p, list) and p and all(type(t) is int for t in p):
            return list(p)  # type: ignore[arg-type]
        if isinstance(p, list) and len(p) == 1:
            inner = p[0]
            if isinstance(inner, str):
                return inner
            if isinstance(inner, list) and inner and all(type(t) is int for t in inner):
                return list(inner)
        raise OpenAIError(
            400,
            "prompt must be a string, a list of token ids, or a list with "
            "exactly one of those (batched prompts are not supported)",
            param="prompt",
        )


def _content(content: str | list[TextPart] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    out = []
    for part in content:
        if part.type != "text":
            raise OpenAIError(
                400,
                f"content part type {part.type!r} is not supported (text only)",
                param="messages",
            )
        out.append(part.text or "")
    return "".join(out)


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    n: int
    stop: tuple[str, ...]
    ignore_eos: bool
    min_tokens: int
    stream: bool
    include_usage: bool


_chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)


def _decode(body: bytes, decoder: msgspec.json.Decoder[Any]) -> Any:
    if not body.strip():
        raise OpenAIError(400, "request body is empty; expected a JSON object")
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        text = str(exc)
        m = _PATH.search(text)
        if "Expected `object`" in text and not m:
            raise OpenAIError(400, "request body must be a JSON object") from None
        if "missing required field" in text:
            field = re.search(r"`(\w+)`", text)
            raise OpenAIError(
                400, f"missing required field: {text}", param=field.group(1) if field else None
            ) from None
        raise OpenAIError(
            400, f"invalid request: {text}", param=m.group(1) if m else None
        ) from None
    except msgspec.DecodeError as exc:
        raise OpenAIError(400, f"malformed JSON: {exc}") from None


def _check_common(req: _Common, max_tokens: int | None) -> None:
    def bad(param: str, message: str) -> OpenAIError:
        return OpenAIError(400, message, param=param)

    if not req.model:
        raise bad("model", "model must be a non-empty string")
    if max_tokens is not None and max_tokens < 1:
        raise bad("max_tokens", f"max_tokens must be at least 1, got {max_tokens}")
    if req.temperature is not None and not 0 <= req.temperature <= 2:
        raise bad("temperature", f"temperature must be in [0, 2], got {req.temperature}")
    if req.top_p is not None and not 0 < req.top_p <= 1:
        raise bad("top_p", f"top_p must be in (0, 1], got {req.top_p}")
    if not 1 <= req.n <= 16:
        raise bad("n", f"n must be in [1, 16], got {req.n}")
    if req.min_tokens < 0:
        raise bad("min_tokens", "min_tokens must be >= 0")
    for name in ("presence_penalty", "frequency_penalty"):
        if not -2 <= getattr(req, name) <= 2:
            raise bad(name, f"{name} must be in [-2, 2]")
    stops = _stops(req.stop)
    if len(stops) > 4 or any(not s for s in stops):
        raise bad("stop", "stop must be up to 4 non-empty strings")
    if req.stream_options is not None and not req.stream:
        raise bad("stream_options", "stream_options is only allowed when stream is true")
    for name in ("logprobs", "top_logprobs", "logit_bias", "response_format"):
        if getattr(req, name) not in (None, False, {}):
            raise bad(name, f"{name} is not supported by this server")


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def _params(req: _Common, max_tokens: int | None) -> GenerationParams:
    return GenerationParams(
        max_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        seed=req.seed,
        n=req.n,
        stop=_stops(req.stop),
        ignore_eos=req.ignore_eos,
        min_tokens=req.min_tokens,
        stream=req.stream,
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
    )


def parse_chat_request(body: bytes) -> ChatCompletionRequest:
    req: ChatCompletionRequest = _decode(body, _chat_decoder)
    if not req.messages:
        raise OpenAIError(400, "messages must be a non-empty list", param="messages")
    _check_common(req, chat_max_tokens(req))
    if req.tools:
        raise OpenAIError(400, "tools are not supported by this server", param="tools")
    for m in req.messages:
        _content(m.content)
    return req


def parse_completion_request(body: bytes) -> CompletionRequest:
    req: CompletionRequest = _decode(body, _completion_decoder)
    if req.prompt is None:
        raise OpenAIError(400, "prompt is required", param="prompt")
    _check_common(req, req.max_tokens)
    if req.echo:
        raise OpenAIError(400, "echo is not supported by this server", param="echo")
    if req.best_of not in (None, 1):
        raise OpenAIError(400, "best_of is not supported by this server", param="best_of")
    if req.suffix:
        raise OpenAIError(400, "suffix is not supported by this server", param="suffix")
    req.prompt_value()
    return req


def chat_max_tokens(req: ChatCompletionRequest) -> int | None:
    return req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens


def chat_generation_params(req: ChatCompletionRequest) -> GenerationParams:
    return _params(req, chat_max_tokens(req))


def completion_generation_params(req: CompletionRequest) -> GenerationParams:
    return _params(req, req.max_tokens)


def resolve_max_tokens(requested: int | None, prompt_len: int, context_length: int) -> int:
    if prompt_len >= context_length or (
        requested is not None and prompt_len + requested > context_length
    ):
        asked = prompt_len + (requested or 0)
        raise OpenAIError(
            400,
            f"This model's maximum context length is {context_length} tokens. However, you "
            f"requested {asked} tokens ({prompt_len} in the messages, {requested or 0} in the "
            "completion). Please reduce the length of the messages or completion.",
            param="messages" if requested is None or prompt_len >= context_length else "max_tokens",
            code="context_length_exceeded",
        )
    return requested if requested is not None else context_length - prompt_len
