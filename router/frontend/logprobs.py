"""Engine logprobs (token ids and floats on the wire) in OpenAI's shapes, token texts added. Pure.

Chat: ``choices[].logprobs.content = [{token, logprob, bytes, top_logprobs: [{token, logprob,
bytes}]}]``. Completions: ``choices[].logprobs = {tokens, token_logprobs, top_logprobs: [{token:
logprob}], text_offset}``, with ``null`` for the first prompt token when the prompt is echoed.
A logprob of ``-inf`` is sent as -9999.0, as vLLM does (JSON has no infinity).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from schemas.tokens import TokenLogprob

TokenText = Callable[[int], str]  # token id -> its text, special tokens included
_FLOOR = -9999.0


def _lp(value: float) -> float:
    return value if math.isfinite(value) else _FLOOR


def _entry(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": _lp(logprob), "bytes": list(text.encode("utf-8"))}


def chat_content(
    token_text: TokenText, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob], k: int
) -> list[dict[str, Any]]:
    out = []
    for token, lp in zip(token_ids, logprobs, strict=False):
        entry = _entry(token_text(token), lp.logprob)
        top = zip(lp.top_ids[:k], lp.top_logprobs[:k], strict=True)
        entry["top_logprobs"] = [_entry(token_text(t), v) for t, v in top]
        out.append(entry)
    return out


class CompletionLogprobs:
    """Accumulates the completions shape across chunks; ``text_offset`` counts characters."""

    def __init__(self, token_text: TokenText, k: int, offset: int = 0) -> None:
        self.token_text = token_text
        self.k = k
        self.offset = offset  # characters of text before the next token

    def add(
        self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob | None]
    ) -> dict[str, Any]:
        tokens: list[str] = []
        values: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for token, lp in zip(token_ids, logprobs, strict=False):
            text = self.token_text(token)
            tokens.append(text)
            offsets.append(self.offset)
            self.offset += len(text)
            if lp is None:
                values.append(None)
                tops.append(None)
                continue
            values.append(_lp(lp.logprob))
            pairs = zip(lp.top_ids[: self.k], lp.top_logprobs[: self.k], strict=True)
            tops.append({self.token_text(t): _lp(v) for t, v in pairs} if self.k else {})
        return {
            "tokens": tokens,
            "token_logprobs": values,
            "top_logprobs": tops,
            "text_offset": offsets,
        }


def merge_completion(parts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The whole-response logprobs object from the per-chunk ones."""
    if not parts:
        return None
    keys = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    return {k: [v for p in parts for v in p[k]] for k in keys}
