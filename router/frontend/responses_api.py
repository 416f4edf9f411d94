"""OpenAI Responses (``POST /v1/responses``): the request, and the chat request it means. Pure.

The body is translated into the chat request it means: ``instructions`` become the system
message; ``input`` is a text or a list of items (messages with ``input_text`` / ``output_text``
parts, ``function_call`` and ``function_call_output`` items of an earlier turn); function
``tools``, ``tool_choice``, ``max_output_tokens``, ``text.format`` (``json_schema``,
``json_object``) map to their chat counterparts. The answer is a ``response`` object whose
``output`` holds a ``reasoning`` item, a ``message`` item and one ``function_call`` item per
call, or, streamed, the ``response.*`` events that build it (each with its ``sequence_number``).

``reasoning.effort`` becomes the chat ``reasoning_effort`` (to the chat template).
``truncation`` other than ``disabled`` and ``include`` other than the output text's logprobs are
refused. The body is decoded into typed structs (``ResponsesRequest``); its response shape is
``responses_shape.py``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from router.frontend.errors import OpenAIError, decode_body
from router.frontend.openai_protocol import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    ToolCall,
)

INCLUDABLE = ("message.output_text.logprobs",)


def _bad(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, message, param=param)


# ---- the request -----------------------------------------------------------------------------


class Part(msgspec.Struct):
    type: str  # input_text | output_text | text
    text: str = ""


class Item(msgspec.Struct):
    """An ``input`` item; which fields count depends on ``type`` (message, function_call,
    function_call_output, reasoning; others are refused by name)."""

    type: str = "message"
    role: str | None = None  # message: user | assistant | system | developer
    content: str | list[Part] = ""  # message
    call_id: str = ""  # function_call, function_call_output
    name: str = ""  # function_call
    arguments: str = "{}"  # function_call: JSON text
    output: Any = ""  # function_call_output: text (anything else is sent as JSON)


class FunctionTool(msgspec.Struct, omit_defaults=True):
    type: str  # function (the others are refused by name)
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(msgspec.Struct, omit_defaults=True):
    type: str  # text | json_object | json_schema
    name: str | None = None
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class Text(msgspec.Struct, omit_defaults=True):
    format: TextFormat | None = None


class Reasoning(msgspec.Struct, omit_defaults=True):
    effort: str | None = None  # to the chat template (reasoning_effort)
    summary: str | None = None


class ResponsesRequest(msgspec.Struct):
    """A ``/v1/responses`` body (unknown fields ignored)."""

    model: str | None = None
    input: str | list[Item] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    top_logprobs: int | None = None
    parallel_tool_calls: bool | None = None
    stream: bool | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: str | dict[str, Any] | None = None  # auto | none | required | a function
    text: Text | None = None
    reasoning: Reasoning | None = None
    include: list[str] | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None  # None: stored (as OpenAI's default)
    previous_response_id: str | None = None  # a stored response this one continues
    background: bool | None = None  # answered at once, run with no client attached
    truncation: str | None = None  # disabled only


_decoder = msgspec.json.Decoder(ResponsesRequest)


def _parts(content: str | list[Part], param: str) -> str:
    if isinstance(content, str):
        return content
    for i, part in enumerate(content):
        if part.type not in ("input_text", "output_text", "text"):
            raise _bad(f"{param}[{i}].type", f"content part type {part.type!r} is not supported")
    return "".join(part.text for part in content)


_ROLES: dict[str, Literal["user", "assistant", "system", "developer"]] = {
    "user": "user",
    "assistant": "assistant",
    "system": "system",
    "developer": "developer",
}


def _history_item(item: dict[str, Any]) -> Item:
    return msgspec.convert(item, Item, strict=False)


def _input(items: str | list[Item] | None, earlier: Sequence[Item] = ()) -> list[ChatMessage]:
    if isinstance(items, str):
        items = [Item(role="user", content=items)]
    if not items:
        raise _bad("input", "input must be a text or a non-empty list of items")
    out: list[ChatMessage] = []
    n = len(earlier)
    for i, item in enumerate([*earlier, *items]):
        param = f"input[{i - n}]" if i >= n else "previous_response_id"
        if item.type == "message":
            role = _ROLES.get(item.role or "")
            if role is None:
                raise _bad(f"{param}.role", "role must be user, assistant, system or developer")
            out.append(ChatMessage(role, _parts(item.content, f"{param}.content")))
        elif item.type == "function_call":
            call = ToolCall(FunctionCall(item.name, item.arguments), item.call_id)
            last = out[-1] if out else None
            if last is not None and last.role == "assistant" and not last.content:
                last.tool_calls = [*(last.tool_calls or ()), call]
            else:
                out.append(ChatMessage("assistant", "", tool_calls=[call]))
        elif item.type == "function_call_output":
            output = item.output
            text = output if isinstance(output, str) else json.dumps(output)
            out.append(ChatMessage("tool", text, tool_call_id=item.call_id))
        elif item.type == "reasoning":
            continue  # an earlier turn's reasoning: not sent back to the model
        else:
            raise _bad(f"{param}.type", f"input item type {item.type!r} is not supported")
    return out


def _tool(tool: FunctionTool, param: str) -> dict[str, Any]:
    if tool.type != "function":
        raise _bad(f"{param}.type", f"tool type {tool.type!r} is not served (function tools only)")
    fields = (
        ("name", tool.name),
        ("description", tool.description),
        ("parameters", tool.parameters),
    )
    return {"type": "function", "function": {k: v for k, v in fields if v is not None}}


def _tool_choice(choice: str | dict[str, Any] | None) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _response_format(text: Text | None) -> dict[str, Any] | None:
    fmt = text.format if text is not None else None
    if fmt is None:
        return None
    if fmt.type == "json_schema":
        return {"type": "json_schema", "json_schema": msgspec.to_builtins(fmt)}
    if fmt.type in ("json_object", "text"):
        return {"type": fmt.type}
    raise _bad("text.format", "text.format.type must be text, json_object or json_schema")


def parse_responses_request(body: bytes) -> ResponsesRequest:
    return decode_body(body, _decoder)


def to_chat_request(
    req: ResponsesRequest, history: Sequence[dict[str, Any]] = ()
) -> ChatCompletionRequest:
    """The chat completions request a Responses request means (``check_chat_request`` then
    validates it as any chat request); ``history``: the input items of the conversation its
    ``previous_response_id`` continues (``responses_items.conversation``)."""
    if req.truncation not in (None, "disabled"):
        raise _bad(
            "truncation", "truncation must be 'disabled' (a prompt that does not fit is a 400)"
        )
    if any(i not in INCLUDABLE for i in req.include or ()):
        raise _bad("include", f"include may only hold {', '.join(INCLUDABLE)}")
    earlier = [_history_item(item) for item in history]
    messages = _input(req.input, earlier)
    if req.instructions:
        messages.insert(0, ChatMessage("system", req.instructions))
    if req.model is None:
        raise _bad("model", "Missing required parameter: 'model'.")
    effort = req.reasoning.effort if req.reasoning is not None else None
    return ChatCompletionRequest(
        model=req.model,
        messages=messages,
        stream=bool(req.stream),
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        parallel_tool_calls=req.parallel_tool_calls,
        seed=req.seed,
        top_logprobs=req.top_logprobs,
        logprobs=True if req.top_logprobs is not None else None,  # asked by top_logprobs
        reasoning_effort=effort,
        tools=[_tool(t, f"tools[{i}]") for i, t in enumerate(req.tools or ())] or None,
        tool_choice=_tool_choice(req.tool_choice),
        response_format=_response_format(req.text),
    )
