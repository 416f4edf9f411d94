"""A long prompt cut into pieces tokenizes token for token as the whole text does, on the shipped
(byte-level) tokenizer; a tokenizer whose tokens span spaces fails the check and is not cut."""

from __future__ import annotations

import random

from tokenizers import Tokenizer, models

from model.split_encode import SplitEncoder, cut_points, verify_split
from tests.support.tokenizers import shipped_tokenizer

_WORDS = [
    "the", "quick", "brown", "fox", "naïve", "café", "Réponds", "日本語のテキスト", "don't",
    "12,345", "print('hi')", "\n\n", "  ", "\t", "🎉", "x", "é", "-", "ünïcödé", "<|im_end|>",
]  # fmt: skip


def _text(n_words: int, seed: int = 7) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(n_words))


def test_cut_points_fall_on_spaces_between_letters_near_even_shares() -> None:
    text = _text(4000)
    cuts = cut_points(text, 4)
    assert len(cuts) == 3 and cuts == sorted(cuts)
    for k, at in enumerate(cuts, start=1):
        assert text[at] == " " and text[at - 1].isalpha() and text[at + 1].isalpha()
        assert len(text) * k // 4 <= at < len(text) * k // 4 + 4096
    assert cut_points("1 2 3 4 5 6 7 8 9 " * 100, 4) == []  # no space between letters: no cut
    assert cut_points(text, 1) == []


def test_pieces_join_to_the_whole_texts_tokens() -> None:
    tok = shipped_tokenizer()
    glue = next(iter(tok.special_tokens.items()))
    texts = [_text(6000, seed) for seed in range(3)] + ["short one", ""]
    encoder = SplitEncoder(tok.encode_batch, pieces=4, min_piece_chars=2000, glue=glue)
    assert encoder(texts) == tok.encode_batch(texts)
    assert encoder.split_texts == 3  # the three long texts went in pieces, the short ones whole
    assert verify_split(tok.encode_batch, glue, [_text(300)])
    assert verify_split(tok.encode_batch, None, [_text(300)])


def test_a_tokenizer_whose_tokens_span_spaces_is_not_cut() -> None:
    vocab = {"a": 0, "b": 1, " ": 2, "a ": 3, "a b": 4}
    bpe = Tokenizer(models.BPE(vocab, [("a", " "), ("a ", "b")]))  # no pre-tokenizer at all

    def encode_batch(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in bpe.encode_batch(texts, add_special_tokens=False)]

    assert encode_batch(["a b"]) == [[4]]
    assert not verify_split(encode_batch, None, ["a b a b"])


def test_a_piece_whose_glue_does_not_come_back_is_tokenized_whole() -> None:
    calls: list[list[str]] = []

    def by_char(texts: list[str]) -> list[list[int]]:  # a tokenizer of one id a character
        calls.append(texts)
        return [[ord(c) for c in t] for t in texts]

    text = "alpha beta gamma delta " * 100
    right = SplitEncoder(by_char, pieces=2, min_piece_chars=100, glue=("§", ord("§")))
    assert right([text]) == by_char([text]) and len(calls[-2][0]) < len(text)
    wrong = SplitEncoder(by_char, pieces=2, min_piece_chars=100, glue=("§", 0))
    calls.clear()
    assert wrong([text]) == [[ord(c) for c in text]]
    assert [len(c) for c in calls] == [2, 1]  # the pieces, then the whole text again
