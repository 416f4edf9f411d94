"""Load a Hugging Face-style model directory into what the fleet needs to serve it.

A directory needs ``tokenizer.json``. It may also have:

- ``chat_template.jinja`` or ``chat_template.json`` (these win, as in ``transformers``), else the
  ``chat_template`` of ``tokenizer_config.json``: a string, or a list of ``{name, template}`` from
  which "default" is picked;
- ``tokenizer_config.json``: ``bos_token`` / ``eos_token`` (strings or ``{"content": ...}``
  dicts) and ``model_max_length``;
- ``config.json`` (or its ``text_config``): the context length (``max_position_embeddings``,
  ``max_seq_len``, ``n_positions``, ``seq_length``) and ``eos_token_id``;
- ``generation_config.json``: more ``eos_token_id``s;
- ``jetfleet.json``: what the fleet cannot read off a Hugging Face directory, the
  ``tool_call_parser`` and ``reasoning_parser`` the model's output needs (the worker flags of the
  same names win).

Context lengths outside ``(0, 10M)`` are ignored (``tokenizer_config`` often says ``1e30`` for "no
limit"); with none found the model gets 4096. The shipped default model is
``infra/models/jetfleet-tiny`` (see ``infra/models/build_tiny_model.py``).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from schemas import ModelCard

_CONTEXT_KEYS = (
    "max_position_embeddings",
    "max_seq_len",
    "n_positions",
    "seq_length",
    "max_sequence_length",
)
# The parsers the frontend knows (router/frontend/tool_parsers.py and reasoning.py).
TOOL_CALL_PARSERS = ("hermes", "llama3_json", "mistral", "qwen3_coder", "pythonic")
REASONING_PARSERS = ("deepseek_r1", "qwen3")
_MAX_SANE_CONTEXT = 10_000_000  # tokens; larger values mean "no limit" and are ignored
_FALLBACK_CONTEXT = 4096  # tokens, when nothing in the directory says


class ModelDirError(ValueError):
    """The directory is not a usable Hugging Face-style model directory."""


@dataclass(frozen=True)
class LocalModel:
    """A model directory as loaded on a worker, before it is published as a ``ModelCard``."""

    name: str  # served model name, as clients send it in "model"
    tokenizer_json: bytes  # raw tokenizer.json
    chat_template: str | None  # jinja2 source, None when the model has none
    context_length: int  # max prompt + completion tokens
    bos_token: str | None
    eos_token: str | None
    eos_token_ids: tuple[int, ...]  # ids that end generation
    block_size: int  # tokens per KV block
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    hidden_size: int = 0  # config.json's hidden_size (d_model, n_embd): the embedding size
    matryoshka_dimensions: tuple[int, ...] | None = None  # None: no; (): any size up to hidden
    kv_bytes_per_token: int = 0  # layers x 2 x KV heads x head dim x dtype bytes (0: unknown)


def default_model_dir() -> Path:
    """The model card shipped in the repo: ``infra/models/jetfleet-tiny``."""
    return Path(str(resources.files("infra") / "models" / "jetfleet-tiny"))


def load_model_dir(
    path: str | Path,
    served_name: str | None = None,
    block_size: int = 16,
    tool_call_parser: str | None = None,
    reasoning_parser: str | None = None,
) -> LocalModel:
    """Load ``path``; ``served_name`` defaults to the directory's basename."""
    path = Path(path)
    tok_file = path / "tokenizer.json"
    if not tok_file.is_file():
        raise ModelDirError(
            f"{path} has no tokenizer.json (need a Hugging Face-style model directory)"
        )
    tokenizer_json = tok_file.read_bytes()
    tok_cfg = _read_json(path / "tokenizer_config.json")
    cfg = _read_json(path / "config.json")
    eos_token = _token_text(tok_cfg.get("eos_token"))
    ours = _read_json(path / "jetfleet.json")
    tool_call_parser = tool_call_parser or _parser(ours, "tool_call_parser")
    reasoning_parser = reasoning_parser or _parser(ours, "reasoning_parser")
    for value, known in (
        (tool_call_parser, TOOL_CALL_PARSERS),
        (reasoning_parser, REASONING_PARSERS),
    ):
        if value is not None and value not in known:
            raise ModelDirError(f"unknown parser {value!r} (known: {', '.join(known)})")
    return LocalModel(
        name=served_name or path.resolve().name,
        tokenizer_json=tokenizer_json,
        chat_template=_chat_template(path, tok_cfg),
        context_length=_context_length(cfg, tok_cfg),
        bos_token=_token_text(tok_cfg.get("bos_token")),
        eos_token=eos_token,
        eos_token_ids=_eos_ids(path, cfg, tokenizer_json, eos_token),
        block_size=block_size,
        tool_call_parser=tool_call_parser,
        reasoning_parser=reasoning_parser,
        hidden_size=_hidden_size(cfg),
        matryoshka_dimensions=matryoshka_dimensions(cfg),
        kv_bytes_per_token=kv_bytes_per_token(cfg),
    )


def matryoshka_dimensions(cfg: dict[str, Any]) -> tuple[int, ...] | None:
    """The embedding sizes a client may ask for (``dimensions``), as vLLM reads them from
    ``config.json``: ``matryoshka_dimensions`` (those), ``is_matryoshka`` (any, ``()``), else
    None (the model's vectors cannot be cut)."""
    dims = cfg.get("matryoshka_dimensions")
    if isinstance(dims, list) and dims:
        return tuple(int(d) for d in dims if isinstance(d, int) and not isinstance(d, bool))
    return () if cfg.get("is_matryoshka") is True else None


_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "fp8": 1}


def kv_bytes_per_token(cfg: dict[str, Any]) -> int:
    """KV cache bytes of one token: layers x 2 (K and V) x KV heads x head dim x dtype bytes,
    from ``config.json`` (or its ``text_config``); 0 when it does not say."""
    text_cfg = cfg.get("text_config")
    c = {**cfg, **text_cfg} if isinstance(text_cfg, dict) else cfg
    layers, heads = c.get("num_hidden_layers"), c.get("num_attention_heads")
    kv_heads = c.get("num_key_value_heads", heads)
    head_dim = c.get("head_dim")
    hidden = c.get("hidden_size")
    if head_dim is None and isinstance(heads, int) and heads and isinstance(hidden, int):
        head_dim = hidden // heads
    values = [v for v in (layers, kv_heads, head_dim) if isinstance(v, int) and v > 0]
    if len(values) != 3 or any(isinstance(v, bool) for v in values):
        return 0
    dtype = _DTYPE_BYTES.get(str(c.get("torch_dtype") or c.get("dtype") or "bfloat16"), 2)
    return values[0] * 2 * values[1] * values[2] * dtype


def _hidden_size(cfg: dict[str, Any]) -> int:
    text_cfg = cfg.get("text_config")
    for source in (cfg, text_cfg if isinstance(text_cfg, dict) else {}):
        for key in ("hidden_size", "d_model", "n_embd"):
            value = source.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return 0


def _parser(ours: dict[str, Any], key: str) -> str | None:
    value = ours.get(key)
    return value if isinstance(value, str) and value else None


def to_model_card(
    local: LocalModel, tokenizer_object: str, tasks: tuple[str, ...] = ("generate",)
) -> ModelCard:
    """The wire card; ``tokenizer_object`` names ``tokenizer.json`` in the object store;
    ``tasks`` are what the worker's engine answers."""
    return ModelCard(
        name=local.name,
        context_length=local.context_length,
        block_size=local.block_size,
        tokenizer_object=tokenizer_object,
        tokenizer_sha256=hashlib.sha256(local.tokenizer_json).hexdigest(),
        chat_template=local.chat_template,
        bos_token=local.bos_token,
        eos_token=local.eos_token,
        eos_token_ids=local.eos_token_ids,
        created_at_s=time.time(),
        tool_call_parser=local.tool_call_parser,
        reasoning_parser=local.reasoning_parser,
        tasks=tasks,
        hidden_size=local.hidden_size,
        matryoshka_dimensions=local.matryoshka_dimensions,
    )


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelDirError(f"{path}: invalid JSON ({exc})") from exc
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _chat_template(path: Path, tok_cfg: dict[str, Any]) -> str | None:
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8") or None
    tpl: Any = _read_json(path / "chat_template.json").get("chat_template")
    if tpl is None:
        tpl = tok_cfg.get("chat_template")
    if isinstance(tpl, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default") or next(iter(named.values()), None)
    return tpl if isinstance(tpl, str) and tpl else None


def _sane_context(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if 0 < value < _MAX_SANE_CONTEXT else None


def _context_length(cfg: dict[str, Any], tok_cfg: dict[str, Any]) -> int:
    text_cfg = cfg.get("text_config")
    for source in (cfg, text_cfg if isinstance(text_cfg, dict) else {}):
        for key in _CONTEXT_KEYS:
            found = _sane_context(source.get(key))
            if found is not None:
                return found
    found = _sane_context(tok_cfg.get("model_max_length"))
    return found if found is not None else _FALLBACK_CONTEXT


def _ids(value: Any) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _eos_ids(
    path: Path, cfg: dict[str, Any], tokenizer_json: bytes, eos_token: str | None
) -> tuple[int, ...]:
    """eos ids from config.json, generation_config.json and the eos token's own id, deduped."""
    found = _ids(cfg.get("eos_token_id"))
    found += _ids(_read_json(path / "generation_config.json").get("eos_token_id"))
    if eos_token is not None:
        found += _ids(_token_id(tokenizer_json, eos_token))
    return tuple(dict.fromkeys(found))


def _token_id(tokenizer_json: bytes, token: str) -> int | None:
    try:
        data = json.loads(tokenizer_json)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelDirError(f"tokenizer.json: invalid JSON ({exc})") from exc
    for added in data.get("added_tokens") or []:
        if isinstance(added, dict) and added.get("content") == token:
            return added.get("id")
    vocab = (data.get("model") or {}).get("vocab")
    return vocab.get(token) if isinstance(vocab, dict) else None
