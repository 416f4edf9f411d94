"""Write the shipped model card ``jetfleet-tiny``: byte-level tokenizer, ChatML template, config.

    python infra/models/build_tiny_model.py

One token per byte (token id = byte value, no merges) plus ChatML special tokens, so any text
tokenizes and token counts equal UTF-8 byte counts (handy for benchmarks: 512 chars = 512 tokens).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>"]
CONTEXT = 8192
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{%- set content = message['content'] -%}"
    "{%- elif message['content'] is none -%}{%- set content = '' -%}"
    "{%- else -%}{%- set content = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') -%}{%- endif -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>' + '\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)


def byte_symbols() -> list[str]:
    """GPT-2's byte-to-symbol table (what the ByteLevel pre-tokenizer emits), indexed by byte."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def build(out: Path) -> None:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``config.json`` into ``out``."""
    # token id == byte value, so raw bytes are valid prompts: tuple(b"hi") == (104, 105)
    vocab = {sym: b for b, sym in enumerate(byte_symbols())}
    assert set(vocab) == set(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": CHAT_TEMPLATE,
                "bos_token": "<|begin_of_text|>",
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "model_max_length": CONTEXT,
                "tokenizer_class": "PreTrainedTokenizerFast",
            },
            indent=2,
        )
        + "\n"
    )
    (out / "config.json").write_text(
        json.dumps(
            {
                "model_type": "jetfleet-tiny",
                "architectures": ["JetfleetTinyForCausalLM"],
                "max_position_embeddings": CONTEXT,
                "vocab_size": tok.get_vocab_size(),
                "bos_token_id": tok.token_to_id("<|begin_of_text|>"),
                "eos_token_id": tok.token_to_id("<|im_end|>"),
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    build(Path(__file__).resolve().parent / "jetfleet-tiny")
