"""Tokenizer and chat template of one model (HF ``tokenizers`` + sandboxed ``jinja2``)."""

from __future__ import annotations

import string
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

_TEXT_SAFE = set(string.ascii_letters + string.digits + " .,;:!?'-")


class ChatTemplateError(ValueError):
    """The model has no chat template, or rendering it failed for these messages."""


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


def _env() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class ModelTokenizer:
    def __init__(
        self,
        tokenizer_json: bytes | str,
        chat_template: str | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
    ) -> None:
        raw = tokenizer_json.decode() if isinstance(tokenizer_json, bytes) else tokenizer_json
        self.tokenizer = Tokenizer.from_str(raw)
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template: jinja2.Template | None = None
        if chat_template:
            try:
                self._template = _env().from_string(chat_template)
            except jinja2.TemplateError as exc:
                raise ChatTemplateError(f"chat template does not compile: {exc}") from exc

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        if self._template is None:
            raise ChatTemplateError("this model has no chat template; use /v1/completions")
        try:
            return str(
                self._template.render(
                    messages=messages,
                    add_generation_prompt=add_generation_prompt,
                    bos_token=self.bos_token or "",
                    eos_token=self.eos_token or "",
                    **extra,
                )
            )
        except ChatTemplateError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, KeyError) as exc:
            raise ChatTemplateError(f"chat template failed for these messages: {exc}") from exc

    def text_safe_token_ids(self, limit: int = 4096) -> tuple[int, ...]:
        """Ids that decode to plain letters, digits, space or punctuation (not special)."""
        special = {t.content for t in self.tokenizer.get_added_tokens_decoder().values()}
        out: list[int] = []
        for tid in range(self.tokenizer.get_vocab_size(with_added_tokens=False)):
            text = self.tokenizer.decode([tid], skip_special_tokens=True)
            if text and text not in special and set(text) <= _TEXT_SAFE:
                out.append(tid)
                if len(out) >= limit:
                    break
        if not out:
            raise ValueError("the tokenizer has no plain-text tokens to generate from")
        return tuple(out)
