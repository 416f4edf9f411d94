"""Incremental detokenization: pieces concatenate to the full decode, multi-byte text included."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from model.detokenize import IncrementalDetokenizer
from model.tokenizer import ModelTokenizer

TEXTS = [
    "plain ascii",
    "café naïve",
    "emoji 😀 and 👩‍👩‍👧 family",
    "中文字符 and 日本語",
    "🎉",
    "mixed: 한국어 ✓ ∑ \U0001d518",
]


def byte_fallback_tokenizer() -> Tokenizer:
    """A Llama-style tokenizer: ``▁`` words plus ``<0xNN>`` byte-fallback tokens."""
    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    vocab |= {"▁": 256, "▁Hello": 257, "▁world": 258, "<unk>": 259}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return tok


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_concatenate_to_full_decode(tok: ModelTokenizer, text: str) -> None:
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.step(i) for i in ids]
    assert "".join(pieces) == tok.decode(ids) == text


def test_incomplete_utf8_yields_empty_string(tok: ModelTokenizer) -> None:
    detok = IncrementalDetokenizer(tok)
    assert [detok.step(i) for i in tok.encode("😀")] == ["", "", "", "😀"]
    assert [detok.step(i) for i in tok.encode("世")] == ["", "", "世"]


def test_starts_after_the_prompt(tok: ModelTokenizer) -> None:
    prompt = tok.encode("<|im_start|>user\n日本<|im_end|>\n<|im_start|>assistant\n")
    output = tok.encode("答え 🎉")
    detok = IncrementalDetokenizer(tok, prompt_ids=prompt)
    assert detok.feed(output) == tok.decode(output) == "答え 🎉"
    assert IncrementalDetokenizer(tok).feed(output) == "答え 🎉"  # byte-level needs no prompt


def test_special_tokens_are_skipped(tok: ModelTokenizer) -> None:
    ids = tok.encode("ok<|im_end|>")
    assert IncrementalDetokenizer(tok).feed(ids) == "ok"


@pytest.mark.parametrize("chunk", [1, 2, 3, 5])
def test_feed_in_chunks(tok: ModelTokenizer, chunk: int) -> None:
    text = "".join(TEXTS)
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok)
    out = "".join(detok.feed(ids[i : i + chunk]) for i in range(0, len(ids), chunk))
    assert out == text


def test_accepts_a_raw_hf_tokenizer(tok: ModelTokenizer) -> None:
    ids = tok.encode("raw 😀")
    assert IncrementalDetokenizer(tok.tokenizer).feed(ids) == "raw 😀"


def test_byte_fallback_tokenizer_multibyte() -> None:
    hf = byte_fallback_tokenizer()
    ids = hf.encode("Hello 😀 world").ids
    assert 0xF0 in ids  # the emoji is spelled as four byte-fallback tokens
    detok = IncrementalDetokenizer(hf)
    assert "".join(detok.step(i) for i in ids) == hf.decode(ids) == "Hello 😀 world"


def test_prompt_context_keeps_leading_space() -> None:
    hf = byte_fallback_tokenizer()
    prompt, generated = hf.token_to_id("▁Hello"), hf.token_to_id("▁world")
    assert IncrementalDetokenizer(hf).step(generated) == "world"  # alone: leading space stripped
    assert IncrementalDetokenizer(hf, prompt_ids=[prompt]).step(generated) == " world"


def test_special_tokens_can_be_kept_except_the_end_of_sequence(tok: ModelTokenizer) -> None:
    """A tool parser whose marker is a special token asks for them (``skip_special_tokens``
    off); the end-of-sequence token still ends the text rather than appear in it."""
    special = tok.special_tokens
    ids = [special["<|im_start|>"], *tok.encode("call"), special["<|im_end|>"]]
    kept = IncrementalDetokenizer(
        tok, skip_special_tokens=False, hide=frozenset([special["<|im_end|>"]])
    )
    assert kept.feed(ids) == "<|im_start|>call"
    assert IncrementalDetokenizer(tok).feed(ids) == "call"
