"""OpenAI Responses (``POST /v1/responses``) on the chat path. Pure.

The body is translated into the chat request it means: ``instructions`` become the system
message; ``input`` is a text or a list of items (messages with ``input_text`` / ``output_text``
parts, ``function_call`` and ``function_call_output`` items of an earlier turn); function
``tools``, ``tool_choice``, ``max_output_tokens``, ``text.format`` (``json_schema``,
``json_object``) map to their chat counterparts. The answer is a ``response`` object whose
``output`` holds a ``reasoning`` item, a ``message`` item and one ``function_call`` item per
call, or, streamed, the ``response.*`` events that build it (each with its ``sequence_number``).

``reasoning.effort`` becomes the chat ``reasoning_effort`` (to the chat template). Responses are
not stored: ``previous_response_id`` and ``background`` are refused (send the whole conversation
in ``input``), ``store`` is accepted and has no effect (the response says ``store: false``);
``truncation`` other than ``disabled`` and ``include`` other than the output text's logprobs are
refused.
"""

from __future__ import annotations

import json
import time
from typing import Any

import msgspec

from router.frontend import asgi
from router.frontend.errors import OpenAIError, decode_object
from router.frontend.openai_protocol import parse_chat_request
from router.frontend.output import Delta, OutCall
from router.frontend.params import chat_generation_params
from router.frontend.serving import Endpoint, Serving
from router.frontend.shapes import FullChoice, encode

ENDPOINT = Endpoint("responses", "resp", chat=True)
INCLUDABLE = ("message.output_text.logprobs",)


async def serve(call: asgi.Call, serving: Serving) -> None:
    """``POST /v1/responses``."""
    body, original = to_chat_body(await call.body())
    creq = parse_chat_request(body)

    def shape(rid: str, prompt_len: int) -> ResponsesShape:
        return ResponsesShape(rid, int(time.time()), creq.model, original)

    await serving.generate(call, ENDPOINT, creq, chat_generation_params(creq), shape, len(body))


def _bad(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, message, param=param)


def _parts(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(param, f"{param} must be a string or a list of content parts")
    out = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text"):
            raise _bad(f"{param}[{i}].type", f"content part type {kind!r} is not supported")
        out.append(str(part.get("text", "")))
    return "".join(out)


def _input(items: Any) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise _bad("input", "input must be a text or a non-empty list of items")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(param, "each input item must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise _bad(f"{param}.role", "role must be user, assistant, system or developer")
            out.append(
                {"role": role, "content": _parts(item.get("content", ""), f"{param}.content")}
            )
        elif kind == "function_call":
            call = {
                "id": item.get("call_id", ""),
                "type": "function",
                "function": {
                    "name": item.get("name", ""),
                    "arguments": item.get("arguments", "{}"),
                },
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and not last["content"]:
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", "")
            text = output if isinstance(output, str) else json.dumps(output)
            out.append({"role": "tool", "tool_call_id": item.get("call_id", ""), "content": text})
        elif kind == "reasoning":
            continue  # an earlier turn's reasoning: not sent back to the model
        else:
            raise _bad(f"{param}.type", f"input item type {kind!r} is not supported")
    return out


def _tool(tool: Any, param: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise _bad(f"{param}.type", f"tool type {kind!r} is not served (function tools only)")
    fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
    return {"type": "function", "function": fn}


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def to_chat_body(body: bytes) -> tuple[bytes, dict[str, Any]]:
    """The chat completions body a Responses body means, and the Responses body itself."""
    data = decode_object(body)
    if data.get("previous_response_id"):
        raise _bad(
            "previous_response_id",
            "previous_response_id is not supported: this server stores no responses; send the "
            "whole conversation in input",
        )
    if data.get("background"):
        raise _bad("background", "background responses are not supported: nothing is stored")
    if data.get("truncation") not in (None, "disabled"):
        raise _bad(
            "truncation", "truncation must be 'disabled' (a prompt that does not fit is a 400)"
        )
    include = data.get("include") or []
    if not isinstance(include, list) or any(i not in INCLUDABLE for i in include):
        raise _bad("include", f"include may only hold {', '.join(INCLUDABLE)}")
    reasoning = data.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise _bad("reasoning", "reasoning must be an object")
    messages = _input(data.get("input"))
    if data.get("instructions"):
        messages.insert(0, {"role": "system", "content": str(data["instructions"])})
    chat: dict[str, Any] = {
        "model": data.get("model"),
        "messages": messages,
        "stream": bool(data.get("stream")),
    }
    for ours, theirs in (
        ("max_tokens", "max_output_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("parallel_tool_calls", "parallel_tool_calls"),
        ("seed", "seed"),
        ("top_logprobs", "top_logprobs"),
    ):
        if data.get(theirs) is not None:
            chat[ours] = data[theirs]
    if reasoning and reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    if chat.get("top_logprobs") is not None:
        chat["logprobs"] = True  # Responses asks with top_logprobs alone
    tools = data.get("tools")
    if tools:
        chat["tools"] = [_tool(t, f"tools[{i}]") for i, t in enumerate(tools)]
    if data.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(data["tool_choice"])
    fmt = (data.get("text") or {}).get("format") if isinstance(data.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        chat["response_format"] = {"type": "json_schema", "json_schema": fmt}
    elif isinstance(fmt, dict) and fmt.get("type") in ("json_object", "text"):
        chat["response_format"] = {"type": fmt["type"]}
    elif fmt is not None:
        raise _bad("text.format", "text.format.type must be text, json_object or json_schema")
    return msgspec.json.encode(chat), data


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {
            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
            "cache_write_tokens": 0,  # nothing is written apart from the prefix cache
        },
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},  # not counted apart
        "total_tokens": usage["total_tokens"],
    }


class ResponsesShape:
    """A Responses answer: the ``response`` object, or the events that build it (one choice)."""

    def __init__(self, rid: str, created: int, model: str, request: dict[str, Any]) -> None:
        self.id = "resp_" + rid.split("-", 1)[-1]
        self.created = created
        self.model = model
        self.request = request
        self._seq = 0
        self._items: list[dict[str, Any]] = []  # output items so far (streaming)
        self._open: dict[str, Any] | None = None  # the item text is streamed into
        self._reason: str | None = None
        self._failed = False
        self._pending_logprobs: list[Any] = []  # of tokens whose text has not come out yet

    def finish(self, reason: str | None, stop_string: str | None) -> None:
        self._reason = reason

    def _response(self, status: str, output: list[Any], usage: Any) -> dict[str, Any]:
        incomplete = {"reason": "max_output_tokens"} if self._reason == "length" else None
        if status == "completed" and incomplete:
            status = "incomplete"
        req = self.request
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": req.get("instructions"),
            "max_output_tokens": req.get("max_output_tokens"),
            "model": self.model,
            "output": output,
            "parallel_tool_calls": req.get("parallel_tool_calls", True),
            "temperature": req.get("temperature", 1.0),
            "top_p": req.get("top_p", 1.0),
            "tool_choice": req.get("tool_choice", "auto"),
            "tools": req.get("tools", []),
            "text": req.get("text") or {"format": {"type": "text"}},
            "reasoning": req.get("reasoning") or {"effort": None, "summary": None},
            "metadata": req.get("metadata") or {},
            "store": False,
            "usage": usage,
        }

    def _event(self, kind: str, data: dict[str, Any]) -> bytes:
        self._seq += 1
        body = encode({"type": kind, "sequence_number": self._seq - 1, **data})
        return b"event: " + kind.encode() + b"\ndata: " + body + b"\n\n"

    # ---- streaming
    def start(self, n: int) -> bytes:
        response = self._response("in_progress", [], None)
        return self._event("response.created", {"response": response}) + self._event(
            "response.in_progress", {"response": response}
        )

    def _begin(self, item: dict[str, Any]) -> bytes:
        out = self._end_open()
        self._items.append(item)
        index = len(self._items) - 1
        out += self._event("response.output_item.added", {"output_index": index, "item": item})
        if item["type"] == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out += self._event(
                "response.content_part.added",
                {"item_id": item["id"], "output_index": index, "content_index": 0, "part": part},
            )
        self._open = item if item["type"] in ("message", "reasoning") else None
        return out

    def _end_open(self) -> bytes:
        item, self._open = self._open, None
        if item is None:
            return b""
        index = self._items.index(item)
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        item["status"] = "completed"
        if item["type"] == "message":
            part = item["content"][0]
            done = {**where, "text": part["text"], "logprobs": part["logprobs"]}
            out = self._event("response.output_text.done", done)
            out += self._event("response.content_part.done", {**where, "part": part})
        else:
            text = item["content"][0]["text"]
            out = self._event("response.reasoning_text.done", {**where, "text": text})
        return out + self._event("response.output_item.done", {"output_index": index, "item": item})

    def delta_chunk(
        self, index: int, d: Delta, finish_reason: str | None, logprobs: Any = None
    ) -> bytes:
        out = b""
        self._pending_logprobs += logprobs or []
        for text, kind in ((d.reasoning, "reasoning"), (d.content, "message")):
            if not text:
                continue
            if self._open is None or self._open["type"] != kind:
                out += self._begin(_item(kind, self.id, len(self._items)))
            assert self._open is not None
            self._open["content"][0]["text"] += text
            where = {"item_id": self._open["id"], "output_index": len(self._items) - 1}
            event = f"response.{'output' if kind == 'message' else 'reasoning'}_text.delta"
            extra: dict[str, Any] = {}
            if kind == "message":  # the logprobs of every token up to this text
                extra["logprobs"], self._pending_logprobs = self._pending_logprobs, []
                self._open["content"][0]["logprobs"] += extra["logprobs"]
            out += self._event(event, {**where, "content_index": 0, "delta": text, **extra})
        for call in d.tool_calls:
            item = _call_item(call, "in_progress") | {"arguments": ""}
            out += self._begin(item)
            where = {"item_id": item["id"], "output_index": len(self._items) - 1}
            out += self._event(
                "response.function_call_arguments.delta", {**where, "delta": call.arguments}
            )
            item.update(arguments=call.arguments, status="completed")
            out += self._event(
                "response.function_call_arguments.done", {**where, "arguments": call.arguments}
            )
            out += self._event("response.output_item.done", {**where, "item": item})
        return out

    def error(self, err: OpenAIError) -> bytes:
        self._failed = True
        return self._event("error", {"code": err.code, "message": err.message, "param": err.param})

    @staticmethod
    def error_json(err: OpenAIError) -> bytes:
        return err.body()

    def end(self, usage: dict[str, Any], include_usage: bool) -> bytes:
        out = b""
        if not self._failed and not any(
            i["type"] in ("message", "function_call") for i in self._items
        ):  # no text and no call: an empty message, as the whole response has
            out += self._begin(_item("message", self.id, len(self._items)))
        out += self._end_open()
        if self._failed:
            return out
        response = self._response("completed", self._items, _usage(usage))
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return out + self._event(kind, {"response": response})

    # ---- whole
    def full(self, choices: list[FullChoice], usage: dict[str, Any]) -> bytes:
        c = choices[0]
        output: list[dict[str, Any]] = []
        if c.reasoning:
            item = _item("reasoning", self.id, len(output))
            item["content"][0]["text"] = c.reasoning
            output.append(item | {"status": "completed"})
        if c.content or not c.calls:
            item = _item("message", self.id, len(output))
            item["content"][0]["text"] = c.content
            item["content"][0]["logprobs"] = c.logprobs or []
            output.append(item | {"status": "completed"})
        output += [_call_item(call, "completed") for call in c.calls]
        return encode(self._response("completed", output, _usage(usage)))


def _item(kind: str, rid: str, index: int) -> dict[str, Any]:
    suffix = f"{rid.removeprefix('resp_')}_{index}"
    if kind == "reasoning":
        return {
            "type": "reasoning",
            "id": f"rs_{suffix}",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": ""}],
            "status": "in_progress",
        }
    return {
        "type": "message",
        "id": f"msg_{suffix}",
        "status": "in_progress",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}],
    }


def _call_item(call: OutCall, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": "fc_" + call.id.removeprefix("call_"),
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    }
