"""OpenAI response bodies and SSE events (chat.completion[.chunk], text_completion)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from router.frontend.errors import OpenAIError
from router.frontend.output import Delta, OutCall

_json = msgspec.json.Encoder()
DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + _json.encode(obj) + b"\n\n"


def encode(obj: Any) -> bytes:
    return _json.encode(obj)


def usage_body(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


@dataclass
class FullChoice:
    """One choice of a whole (non-streamed) response."""

    content: str
    reason: str | None
    reasoning: str = ""
    calls: list[OutCall] = field(default_factory=list)
    logprobs: Any = None  # chat: the content list; completions: the logprobs object


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


class CompletionShape(ChatShape):
    """Legacy completions: ``text`` in both the chunks and the full response."""

    object_chunk = "text_completion"
    object_full = "text_completion"

    def role_chunk(self, index: int) -> bytes:
        return b""

    def delta_chunk(
        self, index: int, d: Delta, finish_reason: str | None, logprobs: Any = None
    ) -> bytes:
        choice = {
            "index": index,
            "text": d.content,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
        return sse({**self.head, "choices": [choice]})

    def full_choice(self, index: int, c: FullChoice) -> dict[str, Any]:
        return {
            "index": index,
            "text": c.content,
            "logprobs": c.logprobs,
            "finish_reason": c.reason,
        }
