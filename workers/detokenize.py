"""Incremental detokenization on the worker, so the frontend stays light.

Wraps HF ``tokenizers``' ``DecodeStream``: each token yields the text it completes, and "" while a
multi-byte character is still incomplete, so concatenating the pieces equals decoding the whole
sequence.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tokenizers.decoders import DecodeStream


class IncrementalDetokenizer:
    __slots__ = ("_stream", "_tokenizer")

    def __init__(self, tokenizer: Any) -> None:
        # accept our ModelTokenizer or a raw tokenizers.Tokenizer
        self._tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
        self._stream = DecodeStream(skip_special_tokens=True)

    def step(self, token_id: int) -> str:
        return self._stream.step(self._tokenizer, token_id) or ""

    def feed(self, token_ids: Iterable[int]) -> str:
        return "".join(self.step(t) for t in token_ids)
