"""Anthropic Messages (``/v1/messages``, ``/v1/messages/count_tokens``) on the chat path.

A Messages body is decoded into typed structs (``MessagesRequest``; a wrong type names the field
as Anthropic does, ``messages.0.content``) and translated into the chat request it means (system
prompt, text, tool use and tool results, thinking), so it is validated, templated, routed,
migrated and observed exactly as a chat completion; only the response is shaped differently: a
``message`` object, or the event stream (``message_start``, ``content_block_start`` / ``_delta``
/ ``_stop`` per block, ``message_delta``, ``message_stop``). Errors use Anthropic's
``{"type": "error", "error": ...}``.

``thinking`` (``enabled`` / ``disabled``) is the chat template's ``enable_thinking`` switch (the
one Qwen3- and DeepSeek-style templates read); ``budget_tokens`` is not enforced apart from
``max_tokens``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import msgspec

from router.frontend import asgi
from router.frontend.errors import OpenAIError, decode_body
from router.frontend.openai_protocol import (
    MAX_STOP,
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    ToolCall,
    check_chat_request,
)
from router.frontend.output import Delta, OutCall
from router.frontend.params import chat_generation_params, checked_chat
from router.frontend.serving import Endpoint, Serving
from router.frontend.shapes import FullChoice, encode

ENDPOINT = Endpoint("messages", "msg", chat=True)
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


async def serve(call: asgi.Call, serving: Serving) -> None:
    """``POST /v1/messages``."""
    body = await call.body()
    creq, params = checked_chat(to_chat_request(parse_messages_request(body)))

    def shape(rid: str, prompt_len: int) -> MessagesShape:
        return MessagesShape(rid, int(time.time()), creq.model, prompt_len)

    await serving.generate(call, ENDPOINT, creq, params, shape, len(body))


async def count_tokens(call: asgi.Call, serving: Serving) -> None:
    """``POST /v1/messages/count_tokens``: the prompt's tokens, template included."""
    body = await call.body()
    creq = count_tokens_request(body)
    served = serving.served(serving.resolve(creq.model)[0])  # an adapter: its base's template
    params = chat_generation_params(creq)
    prompt = await serving.prompts.chat(served, creq, params, len(body))
    await asgi.send_json(call.send, 200, encode({"input_tokens": len(prompt)}))


def error_body(err: OpenAIError) -> bytes:
    kind = _ERROR_TYPES.get(err.status, "api_error")
    return encode({"type": "error", "error": {"type": kind, "message": err.message}})


def _bad(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, f"{param}: {message}", param=param)


# ---- the request -----------------------------------------------------------------------------


class Block(msgspec.Struct):
    """A content block; which fields count depends on ``type`` (text, thinking,
    redacted_thinking, tool_use, tool_result; others are refused by name)."""

    type: str
    text: str = ""  # text
    thinking: str = ""  # thinking
    id: str = ""  # tool_use
    name: str = ""  # tool_use
    input: dict[str, Any] | None = None  # tool_use: the call's arguments
    tool_use_id: str = ""  # tool_result
    content: str | list[Block] | None = None  # tool_result
    is_error: bool | None = None  # tool_result


class Message(msgspec.Struct):
    role: str  # user | assistant
    content: str | list[Block]


class Tool(msgspec.Struct):
    name: str
    input_schema: dict[str, Any] | None = None
    description: str | None = None
    type: str | None = None  # custom (or none); Anthropic's server tools are refused


class ToolChoice(msgspec.Struct):
    type: str  # auto | any | tool | none
    name: str | None = None  # type tool
    disable_parallel_tool_use: bool | None = None


class Thinking(msgspec.Struct):
    type: str  # enabled | disabled
    budget_tokens: int | None = None  # not enforced apart from max_tokens


class MessagesRequest(msgspec.Struct):
    """A ``/v1/messages`` body (unknown fields ignored)."""

    model: str | None = None
    max_tokens: int | None = None  # required
    messages: list[Message] | None = None
    system: str | list[Block] | None = None
    temperature: float | None = None  # [0, 1]
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None  # ours, for reproducible runs
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    thinking: Thinking | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    metadata: dict[str, Any] | None = None


_decoder = msgspec.json.Decoder(MessagesRequest)


def _text(content: str | list[Block], param: str) -> str:
    if isinstance(content, str):
        return content
    for i, block in enumerate(content):
        if block.type != "text":
            raise _unsupported(f"{param}.{i}", block.type)
    return "".join(block.text for block in content)


def _unsupported(param: str, kind: str) -> OpenAIError:
    return _bad(param, f"content block type {kind!r} is not supported here")


def _messages(req: MessagesRequest) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    if req.system:
        out.append(ChatMessage("system", _text(req.system, "system")))
    if not req.messages:
        raise _bad("messages", "messages must be a non-empty list")
    for i, m in enumerate(req.messages):
        if m.role not in ("user", "assistant"):
            raise _bad(f"messages.{i}.role", "role must be 'user' or 'assistant'")
        blocks = [Block("text", m.content)] if isinstance(m.content, str) else m.content
        if m.role == "assistant":
            out.append(_assistant(blocks, f"messages.{i}.content"))
        else:
            out.extend(_user(blocks, f"messages.{i}.content"))
    return out


def _assistant(blocks: list[Block], param: str) -> ChatMessage:
    text, thinking, calls = [], [], []
    for j, b in enumerate(blocks):
        if b.type == "text":
            text.append(b.text)
        elif b.type == "thinking":
            thinking.append(b.thinking)
        elif b.type == "redacted_thinking":
            continue
        elif b.type == "tool_use":
            args = json.dumps(b.input or {}, ensure_ascii=False)
            calls.append(ToolCall(FunctionCall(b.name, args), b.id))
        else:
            raise _unsupported(f"{param}.{j}", b.type)
    return ChatMessage(
        "assistant",
        "".join(text),
        reasoning_content="".join(thinking) if thinking else None,
        tool_calls=calls or None,
    )


def _user(blocks: list[Block], param: str) -> list[ChatMessage]:
    results, text = [], []
    for j, b in enumerate(blocks):
        if b.type == "text":
            text.append(b.text)
        elif b.type == "tool_result":
            content = _text(b.content or "", f"{param}.{j}.content")
            if b.is_error:
                content = f"Error: {content}"
            results.append(ChatMessage("tool", content, tool_call_id=b.tool_use_id))
        else:
            raise _unsupported(f"{param}.{j}", b.type)
    return results + ([ChatMessage("user", "".join(text))] if text else [])


def _tool_choice(choice: ToolChoice | None) -> tuple[Any, bool | None]:
    if choice is None:
        return None, None
    if choice.type not in ("auto", "any", "tool", "none"):
        raise _bad("tool_choice", "tool_choice.type must be auto, any, tool or none")
    parallel = False if choice.disable_parallel_tool_use else None
    if choice.type == "tool":
        return {"type": "function", "function": {"name": choice.name}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type], parallel


def _tool(tool: Tool, param: str) -> dict[str, Any]:
    if tool.type not in (None, "custom"):
        raise _bad(f"{param}.type", f"tool type {tool.type!r} is not served")
    fn: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema or {"type": "object"}}
    if tool.description:
        fn["description"] = tool.description
    return {"type": "function", "function": fn}


def parse_messages_request(body: bytes) -> MessagesRequest:
    return decode_body(body, _decoder, path_style="anthropic")


def to_chat_request(req: MessagesRequest) -> ChatCompletionRequest:
    """The chat completions request a Messages request means (``check_chat_request`` then
    validates it as any chat request)."""
    if req.model is None:
        raise _bad("model", "model is required")
    if req.max_tokens is None or req.max_tokens < 1:
        raise _bad("max_tokens", "max_tokens is required and must be a positive integer")
    if req.temperature is not None and not 0 <= req.temperature <= 1:
        raise _bad("temperature", "temperature must be a number in [0, 1]")
    messages = _messages(req)
    stops = req.stop_sequences or None
    if stops is not None and len(stops) > MAX_STOP:
        raise _bad("stop_sequences", f"stop_sequences may hold at most {MAX_STOP} strings")
    template_kwargs = None
    if req.thinking is not None:  # the template's switch (Qwen3, DeepSeek, ...); see the README
        if req.thinking.type not in ("enabled", "disabled"):
            raise _bad("thinking.type", "thinking.type must be 'enabled' or 'disabled'")
        template_kwargs = {"enable_thinking": req.thinking.type == "enabled"}
    tools = [_tool(t, f"tools.{i}") for i, t in enumerate(req.tools or ())] or None
    choice, parallel = _tool_choice(req.tool_choice)
    return ChatCompletionRequest(
        model=req.model,
        messages=messages,
        max_tokens=req.max_tokens,
        stream=bool(req.stream),
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        seed=req.seed,
        stop=stops,
        chat_template_kwargs=template_kwargs,
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=parallel,
    )


def count_tokens_request(body: bytes) -> ChatCompletionRequest:
    """The chat request whose prompt ``/v1/messages/count_tokens`` counts (no max_tokens)."""
    req = parse_messages_request(body)
    return check_chat_request(
        to_chat_request(msgspec.structs.replace(req, max_tokens=1, stream=False))
    )


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return {
        "input_tokens": usage["prompt_tokens"] - cached,
        "output_tokens": usage["completion_tokens"],
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def _tool_use(call: OutCall) -> dict[str, Any]:
    try:
        args = json.loads(call.arguments)
    except ValueError:
        args = {}
    return {"type": "tool_use", "id": call.id.replace("call_", "toolu_", 1), "name": call.name,
            "input": args}  # fmt: skip


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + encode({"type": kind, **data}) + b"\n\n"


class MessagesShape:
    """A Messages response: the ``message`` object, or its event stream (one choice)."""

    def __init__(self, rid: str, created: int, model: str, prompt_tokens: int = 0) -> None:
        self.id = "msg_" + rid.split("-", 1)[-1]
        self.model = model
        self._block = -1  # index of the open content block
        self._kind = ""  # "text" | "thinking" | ""
        self._reason: str | None = None
        self._stop: str | None = None
        self._failed = False
        self.prompt_tokens = prompt_tokens

    def _message(self, content: list[Any], usage: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": _STOP_REASONS.get(self._reason or "", self._reason),
            "stop_sequence": self._stop,
            "usage": usage,
        }

    def finish(self, reason: str | None, stop_string: str | None) -> None:
        self._reason = "stop_sequence" if stop_string else reason
        self._stop = stop_string

    # ---- streaming
    def start(self, n: int) -> bytes:
        usage = {"input_tokens": self.prompt_tokens, "output_tokens": 0}
        message = self._message([], usage) | {"stop_reason": None}
        return _event("message_start", {"message": message})

    def _open(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close()
        self._block += 1
        self._kind = kind
        return out + _event("content_block_start", {"index": self._block, "content_block": block})

    def _close(self) -> bytes:
        if not self._kind:
            return b""
        self._kind = ""
        return _event("content_block_stop", {"index": self._block})

    def delta_chunk(
        self, index: int, d: Delta, finish_reason: str | None, logprobs: Any = None
    ) -> bytes:
        out = b""
        if d.reasoning:
            if self._kind != "thinking":
                block = {"type": "thinking", "thinking": "", "signature": ""}
                out += self._open("thinking", block)
            delta = {"type": "thinking_delta", "thinking": d.reasoning}
            out += _event("content_block_delta", {"index": self._block, "delta": delta})
        if d.content:
            if self._kind != "text":
                out += self._open("text", {"type": "text", "text": ""})
            delta = {"type": "text_delta", "text": d.content}
            out += _event("content_block_delta", {"index": self._block, "delta": delta})
        for call in d.tool_calls:
            block = _tool_use(call)
            out += self._open("tool_use", {**block, "input": {}})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            out += _event("content_block_delta", {"index": self._block, "delta": delta})
        return out

    def error(self, err: OpenAIError) -> bytes:
        self._failed = True
        kind = _ERROR_TYPES.get(err.status, "api_error")
        return _event("error", {"error": {"type": kind, "message": err.message}})

    @staticmethod
    def error_json(err: OpenAIError) -> bytes:
        return error_body(err)

    def end(self, usage: dict[str, Any], include_usage: bool) -> bytes:
        if self._failed:
            return b""
        stop = _STOP_REASONS.get(self._reason or "", self._reason)
        delta = {"stop_reason": stop, "stop_sequence": self._stop}
        out = b""
        if self._block < 0:  # nothing was said: one empty text block, as the whole message has
            out += self._open("text", {"type": "text", "text": ""})
        out += self._close()
        out += _event("message_delta", {"delta": delta, "usage": _usage(usage)})
        return out + _event("message_stop", {})

    # ---- whole
    def full(self, choices: list[FullChoice], usage: dict[str, Any]) -> bytes:
        c = choices[0]
        content: list[dict[str, Any]] = []
        if c.reasoning:
            content.append({"type": "thinking", "thinking": c.reasoning, "signature": ""})
        if c.content or not (c.calls or c.reasoning):
            content.append({"type": "text", "text": c.content})
        content += [_tool_use(call) for call in c.calls]
        return encode(self._message(content, _usage(usage)))
