"""``POST /v1/completions``: the legacy completions family (request: ``openai_protocol.py``;
a prompt of text, token ids or ``prompt_embeds``) and its ``text_completion`` shape."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from router.frontend import asgi
from router.frontend.chat import ChatShape
from router.frontend.output import Delta
from router.frontend.params import parse_completion
from router.frontend.serving import Endpoint, Serving
from router.frontend.shapes import FullChoice, sse

ENDPOINT = Endpoint("completions", "cmpl", chat=False)


async def serve(call: asgi.Call, serving: Serving) -> None:
    body = await call.body()
    creq, params = parse_completion(body)
    shape = partial(_shape, creq.model)
    await serving.generate(call, ENDPOINT, creq, params, shape, len(body))


def _shape(model: str, rid: str, _prompt_len: int) -> CompletionShape:
    return CompletionShape(rid, int(time.time()), model)


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
