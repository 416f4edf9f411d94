"""``POST /v1/chat/completions``: the chat family (request: ``openai_protocol.py``) and its
response shape, ``chat.completion`` (whole) or ``chat.completion.chunk`` events."""

from __future__ import annotations

import time
from typing import Any

from router.frontend import asgi
from router.frontend.errors import OpenAIError
from router.frontend.output import Delta
from router.frontend.params import parse_chat
from router.frontend.serving import Endpoint, Serving
from router.frontend.shapes import DONE, FullChoice, encode, sse

ENDPOINT = Endpoint("chat", "chatcmpl", chat=True)


async def serve(call: asgi.Call, serving: Serving) -> None:
    body = await call.body()
    creq, params = parse_chat(body)

    def shape(rid: str, _prompt_len: int) -> ChatShape:
        return ChatShape(rid, int(time.time()), creq.model)

    await serving.generate(call, ENDPOINT, creq, params, shape, len(body))


class ChatShape:
    """Chat completions: ``delta.content`` when streaming, ``message`` in the full response."""

    object_chunk = "chat.completion.chunk"
    object_full = "chat.completion"

    def __init__(self, rid: str, created: int, model: str) -> None:
        self.head = {"id": rid, "object": self.object_chunk, "created": created, "model": model}
        self.rid, self.created, self.model = rid, created, model

    def start(self, n: int) -> bytes:
        """What a stream opens with (the role chunk of each choice)."""
        return b"".join(self.role_chunk(i) for i in range(n))

    def finish(self, reason: str | None, stop_string: str | None) -> None:
        """A choice ended (chat shapes need nothing more than the finish_reason)."""

    def error(self, err: OpenAIError) -> bytes:
        """An error once the stream has begun: an OpenAI error object as a data line."""
        return b"data: " + err.body() + b"\n\n"

    @staticmethod
    def error_json(err: OpenAIError) -> bytes:
        return err.body()

    def end(self, usage: dict[str, Any], include_usage: bool) -> bytes:
        return (self.usage_chunk(usage) if include_usage else b"") + DONE

    def role_chunk(self, index: int) -> bytes:
        delta = {"role": "assistant", "content": ""}
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        return sse({**self.head, "choices": [choice]})

    def delta_chunk(
        self, index: int, d: Delta, finish_reason: str | None, logprobs: Any = None
    ) -> bytes:
        delta: dict[str, Any] = {}
        if d.reasoning:
            delta["reasoning_content"] = d.reasoning
        if d.content:
            delta["content"] = d.content
        if d.tool_calls:
            delta["tool_calls"] = [c.openai(with_index=True) for c in d.tool_calls]
        lp = {"content": logprobs} if logprobs is not None else None
        choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish_reason}
        return sse({**self.head, "choices": [choice]})

    def usage_chunk(self, usage: dict[str, Any]) -> bytes:
        return sse({**self.head, "choices": [], "usage": usage})

    def full_choice(self, index: int, c: FullChoice) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": c.content}
        if c.calls:
            message["tool_calls"] = [call.openai() for call in c.calls]
            message["content"] = c.content or None
        if c.reasoning:
            message["reasoning_content"] = c.reasoning
        lp = {"content": c.logprobs} if c.logprobs is not None else None
        return {"index": index, "message": message, "logprobs": lp, "finish_reason": c.reason}

    def full(self, choices_in: list[FullChoice], usage: dict[str, Any]) -> bytes:
        """The whole (non-streamed) response body."""
        choices = [self.full_choice(i, c) for i, c in enumerate(choices_in)]
        return encode(
            {
                "id": self.rid,
                "object": self.object_full,
                "created": self.created,
                "model": self.model,
                "choices": choices,
                "usage": usage,
            }
        )
