"""The shipped model's tokenizer (``jetfleet-tiny``: byte-level, a chat template), as a worker
and a frontend load it; small BPEs trained here, whose tokens a cut inside a word changes."""

from __future__ import annotations

import random

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from model.card import default_model_dir, load_model_dir
from model.tokenizer import ModelTokenizer


def shipped_tokenizer() -> ModelTokenizer:
    local = load_model_dir(default_model_dir())
    return ModelTokenizer(
        local.tokenizer_json, local.chat_template, local.bos_token, local.eos_token
    )


WORDS = [
    "the", "quick", "brown", "fox", "naïve", "café", "Réponds", "日本語のテキスト", "don't",
    "12,345", "print('hi')", "\n\n", "  ", "\t", "🎉", "x", "é", "-", "ünïcödé", "<|im_end|>",
    "jumps", "over", "lazy", "dogs", "brownish", "quickly", "thereby",
]  # fmt: skip


def words_text(n_words: int, seed: int = 7) -> str:
    """``n_words`` words of many scripts and shapes, spaced, the same for a seed."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def trained_bpe(kind: str) -> ModelTokenizer:
    """A small BPE (``byte-level`` or ``metaspace``) trained here: it merges within words, so a
    cut inside a word changes its tokens."""
    tok = Tokenizer(models.BPE())
    if kind == "byte-level":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        alphabet = []
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|im_end|>"], initial_alphabet=alphabet
    )
    tok.train_from_iterator([words_text(200, seed) for seed in range(50)], trainer)
    return ModelTokenizer(tok.to_str())
