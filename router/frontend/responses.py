"""OpenAI response bodies and SSE events (chat.completion[.chunk], text_completion)."""

from __future__ import annotations

from typing import Any

import msgspec

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


class ChatShape:
    """Chat completions: ``delta.content`` when streaming, ``message`` in the full response."""

    object_chunk = "chat.completion.chunk"
    object_full = "chat.completion"

    def __init__(self, rid: str, created: int, model: str) -> None:
        self.head = {"id": rid, "object": self.object_chunk, "created": created, "model": model}
        self.rid, self.created, self.model = rid, created, model

    def role_chunk(self, index: int) -> bytes:
        delta = {"role": "assistant", "content": ""}
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        return sse({**self.head, "choices": [choice]})

    def delta_chunk(self, index: int, text: str, finish_reason: str | None) -> bytes:
        delta = {"content": text} if text else {}
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return sse({**self.head, "choices": [choice]})

    def usage_chunk(self, usage: dict[str, Any]) -> bytes:
        return sse({**self.head, "choices": [], "usage": usage})

    def full_choice(self, index: int, text: str, reason: str | None) -> dict[str, Any]:
        message = {"role": "assistant", "content": text}
        return {"index": index, "message": message, "logprobs": None, "finish_reason": reason}

    def full(self, texts: list[str], reasons: list[str | None], usage: dict[str, Any]) -> bytes:
        """The whole (non-streamed) response body."""
        choices = [
            self.full_choice(i, t, r) for i, (t, r) in enumerate(zip(texts, reasons, strict=True))
        ]
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

    def delta_chunk(self, index: int, text: str, finish_reason: str | None) -> bytes:
        choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return sse({**self.head, "choices": [choice]})

    def full_choice(self, index: int, text: str, reason: str | None) -> dict[str, Any]:
        return {"index": index, "text": text, "logprobs": None, "finish_reason": reason}
