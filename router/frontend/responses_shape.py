"""The OpenAI Responses answer (``responses_api.py``): a ``response`` object whose ``output``
holds a ``reasoning`` item, a ``message`` item and one ``function_call`` item per call, or,
streamed, the ``response.*`` events that build it (each with its ``sequence_number``). It
repeats the request's settings (``ResponsesRequest``) as OpenAI's does. Pure."""

from __future__ import annotations

from typing import Any

import msgspec

from router.frontend.errors import OpenAIError
from router.frontend.output import Delta, OutCall
from router.frontend.responses_api import ResponsesRequest
from router.frontend.shapes import FullChoice, encode


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

    def __init__(
        self,
        response_id: str,
        created: int,
        model: str,
        request: ResponsesRequest,
        stored: bool = False,
    ) -> None:
        self.id = response_id
        self.created = created
        self.model = model
        self.request = request
        self.stored = stored
        self.final: dict[str, Any] | None = None  # the whole response, once made
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
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": _given(req.parallel_tool_calls, True),
            "temperature": _given(req.temperature, 1.0),
            "top_p": _given(req.top_p, 1.0),
            "tool_choice": _given(req.tool_choice, "auto"),
            "tools": msgspec.to_builtins(req.tools or []),
            "text": msgspec.to_builtins(req.text) if req.text else {"format": {"type": "text"}},
            "reasoning": (
                msgspec.to_builtins(req.reasoning)
                if req.reasoning
                else {"effort": None, "summary": None}
            ),
            "metadata": req.metadata or {},
            "store": self.stored,
            "background": bool(req.background),
            "previous_response_id": req.previous_response_id,
            "usage": usage,
        }

    def snapshot(self, status: str) -> dict[str, Any]:
        """The response object before any output (``queued``, ``in_progress``)."""
        return self._response(status, [], None)

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
        self.final = response
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
        self.final = self._response("completed", output, _usage(usage))
        return encode(self.final)


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


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
