"""Anthropic Messages (``/v1/messages``, ``/v1/messages/count_tokens``) on the chat path. Pure.

A Messages body is translated into the chat request it means (system prompt, text, tool use and
tool results, thinking), so it is validated, templated, routed, migrated and observed exactly as
a chat completion; only the response is shaped differently: a ``message`` object, or the event
stream (``message_start``, ``content_block_start`` / ``_delta`` / ``_stop`` per block,
``message_delta``, ``message_stop``). Errors use Anthropic's ``{"type": "error", "error": ...}``.

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
from router.frontend.errors import OpenAIError, decode_object
from router.frontend.openai_protocol import MAX_STOP, parse_chat_request
from router.frontend.output import Delta, OutCall
from router.frontend.params import chat_generation_params
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
    body, _ = to_chat_body(await call.body())
    creq = parse_chat_request(body)

    def shape(rid: str, prompt_len: int) -> MessagesShape:
        return MessagesShape(rid, int(time.time()), creq.model, prompt_len)

    await serving.generate(call, ENDPOINT, creq, chat_generation_params(creq), shape, len(body))


async def count_tokens(call: asgi.Call, serving: Serving) -> None:
    """``POST /v1/messages/count_tokens``: the prompt's tokens, template included."""
    body = await call.body()
    creq = parse_chat_request(count_tokens_body(body))
    served = serving.served(creq.model)
    params = chat_generation_params(creq)
    prompt = await serving.prompts.chat(served, creq, params, len(body))
    await asgi.send_json(call.send, 200, encode({"input_tokens": len(prompt)}))


def error_body(err: OpenAIError) -> bytes:
    kind = _ERROR_TYPES.get(err.status, "api_error")
    return encode({"type": "error", "error": {"type": kind, "message": err.message}})


def _bad(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, f"{param}: {message}", param=param)


def _text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(param, "content must be a string or a list of content blocks")
    out = []
    for i, block in enumerate(content):
        if not isinstance(block, dict) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise _bad(f"{param}.{i}", f"content block type {kind!r} is not supported here")
        out.append(str(block.get("text", "")))
    return "".join(out)


def _messages(data: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    system = data.get("system")
    if system:
        out.append({"role": "system", "content": _text(system, "system")})
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "messages must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise _bad(f"messages.{i}.role", "role must be 'user' or 'assistant'")
        content = m.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise _bad(f"messages.{i}.content", "content must be a string or a list of blocks")
        if m["role"] == "assistant":
            out.append(_assistant(blocks, f"messages.{i}.content"))
        else:
            out.extend(_user(blocks, f"messages.{i}.content"))
    return out


def _assistant(blocks: list[Any], param: str) -> dict[str, Any]:
    text, thinking, calls = [], [], []
    for j, b in enumerate(blocks):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text":
            text.append(str(b.get("text", "")))
        elif kind == "thinking":
            thinking.append(str(b.get("thinking", "")))
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            args = json.dumps(b.get("input") or {}, ensure_ascii=False)
            fn = {"name": b.get("name", ""), "arguments": args}
            calls.append({"id": b.get("id", ""), "type": "function", "function": fn})
        else:
            raise _bad(f"{param}.{j}", f"content block type {kind!r} is not supported here")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    if calls:
        message["tool_calls"] = calls
    return message


def _user(blocks: list[Any], param: str) -> list[dict[str, Any]]:
    results, text = [], []
    for j, b in enumerate(blocks):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text":
            text.append(str(b.get("text", "")))
        elif kind == "tool_result":
            content = _text(b.get("content") or "", f"{param}.{j}.content")
            if b.get("is_error"):
                content = f"Error: {content}"
            results.append(
                {"role": "tool", "tool_call_id": b.get("tool_use_id", ""), "content": content}
            )
        else:
            raise _bad(f"{param}.{j}", f"content block type {kind!r} is not supported here")
    return results + ([{"role": "user", "content": "".join(text)}] if text else [])


def _tool_choice(choice: Any) -> tuple[Any, bool | None]:
    if choice is None:
        return None, None
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise _bad("tool_choice", "tool_choice.type must be auto, any, tool or none")
    parallel = False if choice.get("disable_parallel_tool_use") else None
    kind = choice["type"]
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[kind], parallel


def to_chat_body(body: bytes) -> tuple[bytes, dict[str, Any]]:
    """The chat completions body a Messages body means, and the Messages body itself."""
    data = decode_object(body)
    if not isinstance(data.get("model"), str):
        raise _bad("model", "model is required")
    max_tokens = data.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise _bad("max_tokens", "max_tokens is required and must be a positive integer")
    temperature = data.get("temperature")
    if temperature is not None and (
        not isinstance(temperature, int | float)
        or isinstance(temperature, bool)
        or not 0 <= temperature <= 1
    ):
        raise _bad("temperature", "temperature must be a number in [0, 1]")
    chat: dict[str, Any] = {
        "model": data["model"],
        "messages": _messages(data),
        "max_tokens": max_tokens,
        "stream": bool(data.get("stream")),
    }
    for key in ("temperature", "top_p", "top_k", "seed"):  # seed: ours, for reproducible runs
        if data.get(key) is not None:
            chat[key] = data[key]
    stops = data.get("stop_sequences")
    if stops:
        if not isinstance(stops, list) or len(stops) > MAX_STOP:
            raise _bad("stop_sequences", f"stop_sequences may hold at most {MAX_STOP} strings")
        chat["stop"] = stops
    thinking = data.get("thinking")
    if thinking is not None:  # the template's switch (Qwen3, DeepSeek, ...); see the README
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind not in ("enabled", "disabled"):
            raise _bad("thinking.type", "thinking.type must be 'enabled' or 'disabled'")
        chat["chat_template_kwargs"] = {"enable_thinking": kind == "enabled"}
    tools = data.get("tools")
    if tools:
        if not isinstance(tools, list):
            raise _bad("tools", "tools must be a list")
        chat["tools"] = [_tool(t, f"tools.{i}") for i, t in enumerate(tools)]
    choice, parallel = _tool_choice(data.get("tool_choice"))
    if choice is not None:
        chat["tool_choice"] = choice
    if parallel is not None:
        chat["parallel_tool_calls"] = parallel
    return msgspec.json.encode(chat), data


def _tool(tool: Any, param: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        raise _bad(param, "each tool needs a name")
    if tool.get("type") not in (None, "custom"):
        raise _bad(f"{param}.type", f"tool type {tool.get('type')!r} is not served")
    fn = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
    if tool.get("description"):
        fn["description"] = tool["description"]
    return {"type": "function", "function": fn}


def count_tokens_body(body: bytes) -> bytes:
    """The chat body whose prompt ``/v1/messages/count_tokens`` counts (max_tokens not needed)."""
    data = decode_object(body)
    return to_chat_body(msgspec.json.encode({**data, "max_tokens": 1, "stream": False}))[0]


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
