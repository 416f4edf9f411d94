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
# ChatML; with ``tools`` a Hermes-style system block (as Qwen 2.5's template), assistant tool
# calls as ``<tool_call>{json}</tool_call>`` and tool results as ``<tool_response>`` user turns,
# so the shipped card's tool calls parse with ``hermes`` (jetfleet.json).
CHAT_TEMPLATE = (
    "{%- macro text(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- elif content is none -%}"
    "{%- else -%}{{- content | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') -}}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0]['role'] == 'system' -%}{{- text(messages[0]['content']) + '\\n\\n' -}}"
    "{%- endif -%}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name "
    'and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": '
    '<function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\' -}}'
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if tools and loop.first and message['role'] == 'system' -%}"
    "{%- elif message['role'] == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + text(message['content'])"
    " + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + text(message['content']) -}}"
    "{%- for call in message['tool_calls'] or [] -%}"
    "{%- set fn = call['function'] if call['function'] is defined else call -%}"
    "{{- '\\n<tool_call>\\n{\\\"name\\\": ' + (fn['name'] | tojson) + ', \\\"arguments\\\": '"
    " + (fn['arguments'] | tojson) + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
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
    """Write ``tokenizer.json``, ``tokenizer_config.json``, ``jetfleet.json`` and ``config.json``
    into ``out``."""
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
    (out / "jetfleet.json").write_text(json.dumps({"tool_call_parser": "hermes"}, indent=2) + "\n")
    (out / "config.json").write_text(
        json.dumps(
            {
                "model_type": "jetfleet-tiny",
                "architectures": ["JetfleetTinyForCausalLM"],
                "max_position_embeddings": CONTEXT,
                "hidden_size": 64,  # the mocker's embeddings have this many dimensions
                "is_matryoshka": True,  # ... and any prefix of them is one (``dimensions``)
                # Llama-3.1-8B's KV geometry (128 KiB a token), so simulated KV transfers between
                # prefill and decode workers take realistic time
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "torch_dtype": "bfloat16",
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
