"""What every API family's response shape does, and the pieces they share. Pure.

A request's generations run on one path (``serving.py``, ``stream.py``) whatever the API; only
the bytes differ. A ``ResponseShape`` turns the path's events into them: for a stream, what it
opens with, one piece per delta, an error once streaming has begun, and what it ends with; for a
whole response, the body (or an error body). Shapes: ``ChatShape`` (chat.py),
``CompletionShape`` (completions.py), ``MessagesShape`` (anthropic.py), ``ResponsesShape``
(responses_api.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

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
    """OpenAI's usage object (the other shapes translate it)."""
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


class ResponseShape(Protocol):
    def start(self, n: int) -> bytes:
        """What a stream of ``n`` choices opens with."""
        ...

    def delta_chunk(
        self, index: int, d: Delta, finish_reason: str | None, logprobs: Any = None
    ) -> bytes:
        """One choice's delta (with its finish reason when it ends)."""
        ...

    def finish(self, reason: str | None, stop_string: str | None) -> None:
        """A choice ended (``stop_string``: the stop string that ended it)."""
        ...

    def error(self, err: OpenAIError) -> bytes:
        """An error once the stream has begun."""
        ...

    def error_json(self, err: OpenAIError) -> bytes:
        """An error instead of a whole response."""
        ...

    def end(self, usage: dict[str, Any], include_usage: bool) -> bytes:
        """What a stream ends with."""
        ...

    def full(self, choices: list[FullChoice], usage: dict[str, Any]) -> bytes:
        """The whole (non-streamed) response body."""
        ...
