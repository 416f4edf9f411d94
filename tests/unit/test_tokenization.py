"""ModelTokenizer: byte-level encode/decode of the shipped card, chat templates, errors."""

from __future__ import annotations

import string
from typing import Any

import pytest

from model.card import default_model_dir
from model.tokenizer import ChatTemplateError, ModelTokenizer


def with_template(template: str | None) -> ModelTokenizer:
    raw = (default_model_dir() / "tokenizer.json").read_bytes()
    return ModelTokenizer(raw, template, "<|begin_of_text|>", "<|im_end|>")


@pytest.mark.parametrize(
    "text", ["hello", "héllo wörld", "emoji 😀🎉", "中文 テキスト", " lead", ""]
)
def test_one_token_per_byte_round_trip(tok: ModelTokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert ids == list(text.encode())
    assert tok.decode(ids) == text


def test_special_tokens(tok: ModelTokenizer) -> None:
    assert tok.vocab_size == 260
    ids = tok.encode("<|im_start|>hi<|im_end|>")
    assert ids == [257, 104, 105, 258]
    assert tok.decode(ids) == "hi"
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>hi<|im_end|>"


@pytest.mark.parametrize(
    ("messages", "add_generation_prompt", "expected"),
    [
        (
            [{"role": "user", "content": "hi"}],
            True,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        ),
        (
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
            False,
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ],
            True,
            "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n",
        ),
        (
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": None}],
            False,
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n",
        ),
    ],
)
def test_shipped_chat_template(
    tok: ModelTokenizer, messages: list[dict[str, Any]], add_generation_prompt: bool, expected: str
) -> None:
    assert (
        tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == expected
    )


@pytest.mark.parametrize(
    ("template", "extra", "expected"),
    [
        (
            "{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}",
            {},
            "<|begin_of_text|>x<|im_end|>",
        ),
        ("{% for m in messages %}\n  {{ m['role'] }}\n{% endfor %}", {}, "  user\n"),  # trim/lstrip
        ("{{ messages | tojson }}", {}, '[{"role": "user", "content": "x"}]'),
        ("{{ {'k': 'é<'} | tojson }}", {}, '{"k": "é<"}'),
        ("{{ tools | length }}", {"tools": [1, 2]}, "2"),
        ("{{ strftime_now('%Y') | length }}", {}, "4"),
        ("{% for m in messages %}{% break %}{% endfor %}done", {}, "done"),
        ("{{ bos_token }}|{{ add_generation_prompt }}", {"bos_token": "<s>"}, "<s>|True"),
    ],
)
def test_template_environment(template: str, extra: dict[str, Any], expected: str) -> None:
    rendered = with_template(template).apply_chat_template(
        [{"role": "user", "content": "x"}], **extra
    )
    assert rendered == expected


def test_missing_template_raises() -> None:
    with pytest.raises(ChatTemplateError, match="no chat template"):
        with_template(None).apply_chat_template([{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    ("template", "match"),
    [
        ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
        ("{{ messages[5]['content'] }}", "failed"),
        ("{{ messages.__class__.__mro__ }}", "failed"),  # the sandbox refuses it
        ("{{ messages.append(1) }}", "failed"),  # immutable sandbox
        ("{{ 1 / 0 }}", "failed"),
    ],
)
def test_template_errors_are_chat_template_errors(template: str, match: str) -> None:
    with pytest.raises(ChatTemplateError, match=match):
        with_template(template).apply_chat_template([{"role": "user", "content": "x"}])


def test_template_that_does_not_compile() -> None:
    with pytest.raises(ChatTemplateError, match="does not compile"):
        with_template("{% for m in messages %}")


def test_chat_template_error_is_value_error() -> None:
    assert issubclass(ChatTemplateError, ValueError)


def test_text_safe_token_ids(tok: ModelTokenizer) -> None:
    ids = tok.text_safe_token_ids()
    safe = set(string.ascii_letters + string.digits + " .,;:!?'-")
    assert len(ids) == len(safe)
    assert all(tok.decode([i]) in safe for i in ids)
    assert not set(ids) & {256, 257, 258, 259}
    assert tok.text_safe_token_ids(limit=5) == ids[:5]
