"""A long prompt cut into pieces tokenizes token for token as the whole text does, on tokenizers
that merge within words (byte-level BPE with its regex, Metaspace that marks the first word); a
tokenizer whose tokens span spaces, or an added token that swallows a space, is never cut."""

from __future__ import annotations

import pytest
from tokenizers import AddedToken, Tokenizer, models

from model.split_encode import SplitEncoder, cut_points, verify_split
from model.tokenizer import ModelTokenizer
from router.frontend.tokenize import _PROBE, PromptTokenizer, TokenizeConfig, TokenizeMetrics
from tests.support.tokenizers import shipped_tokenizer, trained_bpe, words_text


def test_cut_points_fall_on_spaces_between_letters_near_even_shares() -> None:
    text = words_text(4000)
    cuts = cut_points(text, 4)
    assert len(cuts) == 3 and cuts == sorted(cuts)
    for k, at in enumerate(cuts, start=1):
        assert text[at] == " " and text[at - 1].isalpha() and text[at + 1].isalpha()
        assert len(text) * k // 4 <= at < len(text) * k // 4 + 4096
    assert cut_points("1 2 3 4 5 6 7 8 9 " * 100, 4) == []  # no space between letters: no cut
    assert cut_points(text, 1) == []


@pytest.mark.parametrize("kind", ["byte-level", "metaspace"])
def test_pieces_join_to_the_whole_texts_tokens(kind: str) -> None:
    tok = trained_bpe(kind)
    text = words_text(300)
    mid_word = next(i for i in range(1, len(text)) if text[i - 1 : i + 1] == "ui")  # "q|uick"
    cut_mid = tok.encode_batch([text[:mid_word], text[mid_word:]])
    assert cut_mid[0] + cut_mid[1] != tok.encode_batch([text])[0]  # this tokenizer can tell
    glue = next(iter(tok.special_tokens.items()))
    texts = [words_text(6000, seed) for seed in range(3)] + ["short one", ""]
    encoder = SplitEncoder(tok.encode_batch, pieces=4, min_piece_chars=2000, glue=glue)
    assert encoder(texts) == tok.encode_batch(texts)
    assert encoder.split_texts == 3  # the three long texts went in pieces, the short ones whole
    assert verify_split(tok.encode_batch, glue, [words_text(300)])
    assert not tok.tokens_span_spaces() and tok.added_tokens_bare


def test_a_tokenizer_whose_tokens_span_spaces_is_not_cut() -> None:
    chars = sorted(set("".join(_PROBE)) | set("zq "))
    vocab = {c: i for i, c in enumerate(chars)} | {"z ": len(chars), "z q": len(chars) + 1}
    bpe = Tokenizer(models.BPE(vocab, [("z", " "), ("z ", "q")]))  # no pre-tokenizer at all

    def encode_batch(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in bpe.encode_batch(texts, add_special_tokens=False)]

    assert encode_batch(["z q"]) == [[len(chars) + 1]]
    assert not verify_split(encode_batch, None, ["z q z q"])  # when the probes hold "z q"
    assert verify_split(encode_batch, None, [*_PROBE, " ".join(_PROBE)])  # the frontend's do not
    tok = ModelTokenizer(bpe.to_str())
    assert tok.tokens_span_spaces()  # its vocabulary tells
    tokenizer = PromptTokenizer(TokenizeConfig(threads=2), TokenizeMetrics(_registry()))
    assert tokenizer._encoder(tok) == tok.encode_batch  # served whole


def test_an_added_token_that_swallows_a_space_turns_cutting_off() -> None:
    tok = trained_bpe("byte-level")
    tokenizer = PromptTokenizer(TokenizeConfig(threads=2), TokenizeMetrics(_registry()))
    assert isinstance(tokenizer._encoder(tok), SplitEncoder)
    tok.tokenizer.add_tokens([AddedToken("Hello", rstrip=True)])
    swallowing = ModelTokenizer(tok.tokenizer.to_str())
    text = "x Hello world y " * 3
    cut = text.index(" world")
    a, b = swallowing.encode_batch([text[:cut], text[cut:]])
    assert a + b != swallowing.encode_batch([text])[0]  # a cut there would be wrong
    assert not swallowing.added_tokens_bare
    assert tokenizer._encoder(swallowing) == swallowing.encode_batch  # so it is served whole


def test_the_shipped_tokenizer_is_cut() -> None:
    tok = shipped_tokenizer()
    tokenizer = PromptTokenizer(TokenizeConfig(threads=2), TokenizeMetrics(_registry()))
    assert isinstance(tokenizer._encoder(tok), SplitEncoder)


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


def _registry():  # type: ignore[no-untyped-def]
    from prometheus_client import CollectorRegistry

    return CollectorRegistry()
