"""The shipped model's tokenizer (``jetfleet-tiny``: byte-level, a chat template), as a worker
and a frontend load it."""

from __future__ import annotations

from model.card import default_model_dir, load_model_dir
from model.tokenizer import ModelTokenizer


def shipped_tokenizer() -> ModelTokenizer:
    local = load_model_dir(default_model_dir())
    return ModelTokenizer(
        local.tokenizer_json, local.chat_template, local.bos_token, local.eos_token
    )
