"""Load a Hugging Face-style model directory into what the fleet needs to serve it.

A directory needs ``tokenizer.json``; it may have ``tokenizer_config.json`` (chat template, bos/eos
tokens, ``model_max_length``), ``chat_template.jinja`` or ``chat_template.json``, and
``config.json`` (context length, eos ids). The shipped default is ``infra/models/jetfleet-tiny``.
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
_MAX_SANE_CONTEXT = 10_000_000  # tokenizer_config often says 1e30 for "no limit"


class ModelDirError(ValueError):
    pass


@dataclass(frozen=True)
class LocalModel:
    name: str
    tokenizer_json: bytes
    chat_template: str | None
    context_length: int
    bos_token: str | None
    eos_token: str | None
    eos_token_ids: tuple[int, ...]
    block_size: int


def default_model_dir() -> Path:
    return Path(str(resources.files("infra") / "models" / "jetfleet-tiny"))


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelDirError(f"{path}: invalid JSON ({exc})") from exc
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(path: Path, tok_cfg: dict[str, Any]) -> str | None:
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    tpl: Any = _read_json(path / "chat_template.json").get("chat_template")
    if tpl is None:
        tpl = tok_cfg.get("chat_template")
    if isinstance(tpl, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default") or next(iter(named.values()), None)
    return tpl if isinstance(tpl, str) else None


def _context_length(cfg: dict[str, Any], tok_cfg: dict[str, Any]) -> int:
    for source in (cfg, cfg.get("text_config") or {}):
        for key in _CONTEXT_KEYS:
            value = source.get(key)
            if isinstance(value, int) and 0 < value < _MAX_SANE_CONTEXT:
                return value
    value = tok_cfg.get("model_max_length")
    if isinstance(value, int | float) and 0 < value < _MAX_SANE_CONTEXT:
        return int(value)
    return 4096


def _eos_ids(cfg: dict[str, Any]) -> tuple[int, ...]:
    value = cfg.get("eos_token_id")
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, int))
    return ()


def load_model_dir(
    path: str | Path, served_name: str | None = None, block_size: int = 16
) -> LocalModel:
    path = Path(path)
    tok_file = path / "tokenizer.json"
    if not tok_file.is_file():
        raise ModelDirError(f"{path} has no tokenizer.json (need a Hugging Face-style model dir)")
    tok_cfg = _read_json(path / "tokenizer_config.json")
    cfg = _read_json(path / "config.json")
    return LocalModel(
        name=served_name or path.resolve().name,
        tokenizer_json=tok_file.read_bytes(),
        chat_template=_chat_template(path, tok_cfg),
        context_length=_context_length(cfg, tok_cfg),
        bos_token=_token_text(tok_cfg.get("bos_token")),
        eos_token=_token_text(tok_cfg.get("eos_token")),
        eos_token_ids=_eos_ids(cfg),
        block_size=block_size,
    )


def to_model_card(local: LocalModel, tokenizer_object: str) -> ModelCard:
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
    )
