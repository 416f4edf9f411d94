"""The prompt prefix cache gives token for token what a fresh tokenization gives: on the shipped
tokenizer, a trained byte-level BPE and a Metaspace (SentencePiece-style) one, with multi-byte
text and cuts inside words, over growing multi-turn conversations."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from model.prompt_cache import SegmentCache, verify
from model.tokenizer import ModelTokenizer
from tests.support.tokenizers import shipped_tokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "naïve café crème brûlée — déjà vu",
    "日本語のテキストと絵文字 🎉🚀 mixed with English words",
    "def f(x):\n    return x * 2  # code, tabs\tand   spaces",
    "numbers 12,345.67 and units 3km/h",
] * 20


def _trained(pre: pre_tokenizers.PreTokenizer, decoder: decoders.Decoder) -> ModelTokenizer:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre
    tok.decoder = decoder
    alphabet = (
        pre_tokenizers.ByteLevel.alphabet() if isinstance(pre, pre_tokenizers.ByteLevel) else []
    )
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIALS, initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    return ModelTokenizer(tok.to_str(), CHATML)


TOKENIZERS = {
    "shipped": shipped_tokenizer,
    "byte-level-bpe": lambda: _trained(
        pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    ),
    "metaspace": lambda: _trained(
        pre_tokenizers.Metaspace(prepend_scheme="first"), decoders.Metaspace()
    ),
}


def _message(rng: random.Random) -> str:
    words = " ".join(" ".join(rng.choice(CORPUS).split()[: rng.randint(1, 8)]) for _ in range(3))
    cut = rng.randint(1, len(words))  # a cut inside a word, multi-byte characters included
    return words[:cut] + rng.choice(["", " ", "  ", "\n", "é", "🎉", "ab"])


@pytest.fixture(params=sorted(TOKENIZERS))
def any_tok(request: pytest.FixtureRequest) -> ModelTokenizer:
    """Each tokenizer of ``TOKENIZERS`` in turn."""
    return TOKENIZERS[request.param]()


def test_multi_turn_conversations_match_fresh_tokenizing(any_tok: ModelTokenizer) -> None:
    rng = random.Random(7)
    cache = SegmentCache(any_tok.special_tokens)
    for _ in range(20):
        messages = [{"role": "system", "content": _message(rng)}]
        for _turn in range(5):
            messages.append({"role": "user", "content": _message(rng)})
            text = any_tok.apply_chat_template(messages, add_generation_prompt=True)
            assert cache.encode([text], any_tok.encode_batch)[0] == any_tok.encode(text)
            messages.append({"role": "assistant", "content": _message(rng)})
    assert cache.stats.hits > cache.stats.misses  # later turns reuse the earlier ones
    assert cache.stats.fallbacks == 0


def test_raw_prompts_with_specials_anywhere_match(any_tok: ModelTokenizer) -> None:
    rng = random.Random(3)
    cache = SegmentCache(any_tok.special_tokens)
    for _ in range(200):
        parts = [_message(rng) if rng.random() < 0.7 else rng.choice(SPECIALS) for _ in range(6)]
        text = "".join(parts)
        for prefix in (text, text[: rng.randint(0, len(text))]):
            assert cache.encode([prefix], any_tok.encode_batch)[0] == any_tok.encode(prefix), prefix


def test_batches_mix_hits_and_misses(any_tok: ModelTokenizer) -> None:
    cache = SegmentCache(any_tok.special_tokens)
    head = any_tok.apply_chat_template([{"role": "system", "content": "shared head " * 30}])
    texts = [head + f"<|im_start|>user\nquestion {i} é<|im_end|>\n" for i in range(8)]
    got = cache.encode(texts, any_tok.encode_batch)
    assert got == [any_tok.encode(t) for t in texts]
    again = cache.encode(texts, any_tok.encode_batch)
    assert again == got and cache.stats.cached_tokens > 0


def test_the_cache_stays_within_its_token_budget() -> None:
    tok = shipped_tokenizer()
    cache = SegmentCache(tok.special_tokens, max_tokens=200)
    for i in range(50):
        text = f"<|im_start|>user\nmessage number {i} with some words<|im_end|>\n"
        cache.encode([text], tok.encode_batch)
    assert 0 < cache.size_tokens <= 200


def test_verify_accepts_real_tokenizers_and_rejects_a_wrong_split(any_tok: ModelTokenizer) -> None:
    conv = any_tok.apply_chat_template(
        [{"role": "user", "content": "héllo wörld"}, {"role": "assistant", "content": "x y"}]
    )
    assert verify(SegmentCache(any_tok.special_tokens), any_tok.encode_batch, [conv])

    def merged(texts: list[str]) -> list[list[int]]:  # a tokenizer whose segments interact
        out = any_tok.encode_batch(texts)
        return [[*ids[:-1], ids[-1] + 1] if len(ids) > 3 else ids for ids in out]

    assert not verify(SegmentCache(any_tok.special_tokens), merged, [conv])


def test_a_broken_split_falls_back_to_the_whole_prompt() -> None:
    tok = shipped_tokenizer()
    cache = SegmentCache(tok.special_tokens)
    text = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    cache.encode([text], tok.encode_batch)  # warm
    calls: list[list[str]] = []

    def lossy(texts: list[str]) -> list[list[int]]:
        calls.append(texts)
        out = tok.encode_batch(texts)
        return [ids[1:] for ids in out] if len(calls) == 1 else out  # first call loses a token

    assert cache.encode([text + "more"], lossy)[0] == tok.encode(text + "more")
    assert cache.stats.fallbacks == 1 and calls[1] == [text + "more"]
