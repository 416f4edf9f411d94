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

    __slots__ = ("_hide", "_stream", "_tokenizer")

    def __init__(
        self,
        tokenizer: ModelTokenizer | Tokenizer,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
        hide: frozenset[int] = frozenset(),
    ) -> None:
        """``skip_special_tokens=False`` keeps special tokens in the text (a tool-call marker
        such as ``[TOOL_CALLS]`` is one), except the ids in ``hide`` (the end-of-sequence
        tokens, which end the text rather than belong to it)."""
        hf = tokenizer.tokenizer if isinstance(tokenizer, ModelTokenizer) else tokenizer
        self._tokenizer: Tokenizer = hf
        self._hide = hide
        context = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:]) if prompt_ids else None
        self._stream = DecodeStream(ids=context, skip_special_tokens=skip_special_tokens)

    def step(self, token_id: int) -> str:
        """The text ``token_id`` completes; "" while a character is incomplete."""
        if token_id in self._hide:
            return ""
        return self._stream.step(self._tokenizer, token_id) or ""

    def feed(self, token_ids: Iterable[int]) -> str:
        """``step`` over several ids, joined."""
        return "".join(self.step(t) for t in token_ids)
