"""Incremental detokenization on the worker, so the frontend stays light.

Wraps HF ``tokenizers``' ``DecodeStream`` (special tokens skipped): each generated token yields the
text it completes, and "" while a multi-byte UTF-8 character is still incomplete, so concatenating
the pieces equals ``decode(all_generated_ids)``.

It starts after the prompt, as vLLM's detokenizer does: the prompt text is never re-emitted. For a
byte-level tokenizer no prompt context is needed; for tokenizers whose decoding of a token depends
on its left neighbour (SentencePiece's leading-space ``▁``), pass ``prompt_ids`` and the last few
seed the stream, so the first generated token decodes as it would inside the full sequence.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from model.tokenizer import ModelTokenizer

PROMPT_CONTEXT_TOKENS = 6  # prompt ids that seed the stream (vLLM uses 5 for the same purpose)


class IncrementalDetokenizer:
    """Text of one sequence's generated tokens, piece by piece."""

    __slots__ = ("_stream", "_tokenizer")

    def __init__(
        self, tokenizer: ModelTokenizer | Tokenizer, prompt_ids: Sequence[int] = ()
    ) -> None:
        hf = tokenizer.tokenizer if isinstance(tokenizer, ModelTokenizer) else tokenizer
        self._tokenizer: Tokenizer = hf
        context = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:]) if prompt_ids else None
        self._stream = DecodeStream(ids=context, skip_special_tokens=True)

    def step(self, token_id: int) -> str:
        """The text ``token_id`` completes; "" while a character is incomplete."""
        return self._stream.step(self._tokenizer, token_id) or ""

    def feed(self, token_ids: Iterable[int]) -> str:
        """``step`` over several ids, joined."""
        return "".join(self.step(t) for t in token_ids)
