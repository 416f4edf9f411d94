"""Loading Hugging Face-style model directories, and the shipped jetfleet-tiny card."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from model.card import (
    LocalModel,
    ModelDirError,
    default_model_dir,
    load_model_dir,
    to_model_card,
)

TINY = default_model_dir()


def make_dir(tmp_path: Path, files: dict[str, Any]) -> Path:
    """A model dir with the shipped tokenizer.json plus ``files`` (dicts written as JSON)."""
    model = tmp_path / "acme-7b"
    model.mkdir()
    (model / "tokenizer.json").write_bytes((TINY / "tokenizer.json").read_bytes())
    for name, content in files.items():
        text = content if isinstance(content, str) else json.dumps(content)
        (model / name).write_text(text)
    return model


def test_shipped_model_loads() -> None:
    local = load_model_dir(TINY)
    assert local.name == "jetfleet-tiny"
    assert local.context_length == 8192
    assert local.eos_token == "<|im_end|>"
    assert local.bos_token == "<|begin_of_text|>"
    assert local.eos_token_ids == (258,)
    assert local.chat_template is not None and "<|im_start|>" in local.chat_template
    assert local.block_size == 16


def test_served_name_and_block_size() -> None:
    local = load_model_dir(str(TINY), served_name="tiny", block_size=32)
    assert (local.name, local.block_size) == ("tiny", 32)


def test_missing_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(ModelDirError, match=r"tokenizer\.json"):
        load_model_dir(tmp_path)


def test_invalid_config_json(tmp_path: Path) -> None:
    with pytest.raises(ModelDirError, match=r"config\.json"):
        load_model_dir(make_dir(tmp_path, {"config.json": "{not json"}))


def test_list_form_template_and_dict_tokens(tmp_path: Path) -> None:
    tok_cfg = {
        "chat_template": [
            {"name": "tool_use", "template": "TOOLS"},
            {"name": "default", "template": "DEFAULT"},
        ],
        "bos_token": {"content": "<|begin_of_text|>", "lstrip": False},
        "eos_token": {"content": "<|endoftext|>", "rstrip": False},
    }
    local = load_model_dir(make_dir(tmp_path, {"tokenizer_config.json": tok_cfg}))
    assert local.name == "acme-7b"
    assert local.chat_template == "DEFAULT"
    assert (local.bos_token, local.eos_token) == ("<|begin_of_text|>", "<|endoftext|>")
    assert local.eos_token_ids == (256,)  # looked up in tokenizer.json's added tokens


def test_list_form_template_without_default(tmp_path: Path) -> None:
    tok_cfg = {"chat_template": [{"name": "rag", "template": "RAG"}]}
    assert load_model_dir(make_dir(tmp_path, {"tokenizer_config.json": tok_cfg})).chat_template == (
        "RAG"
    )


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({}, None),
        ({"tokenizer_config.json": {"chat_template": "CFG"}}, "CFG"),
        (
            {
                "tokenizer_config.json": {"chat_template": "CFG"},
                "chat_template.json": {"chat_template": "JSON"},
            },
            "JSON",
        ),
        (
            {"chat_template.jinja": "JINJA", "chat_template.json": {"chat_template": "JSON"}},
            "JINJA",
        ),
    ],
)
def test_chat_template_sources(tmp_path: Path, files: dict[str, Any], expected: str | None) -> None:
    assert load_model_dir(make_dir(tmp_path, files)).chat_template == expected


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({}, 4096),
        ({"config.json": {"max_position_embeddings": 32768}}, 32768),
        ({"config.json": {"max_seq_len": 2048}}, 2048),
        ({"config.json": {"n_positions": 1024}}, 1024),
        ({"config.json": {"seq_length": 4000}}, 4000),
        ({"config.json": {"text_config": {"max_position_embeddings": 131072}}}, 131072),
        ({"tokenizer_config.json": {"model_max_length": 16384}}, 16384),
        ({"tokenizer_config.json": {"model_max_length": 1e30}}, 4096),
        (
            {
                "config.json": {"max_position_embeddings": 8192},
                "tokenizer_config.json": {"model_max_length": 2048},
            },
            8192,
        ),
        ({"config.json": {"max_position_embeddings": 0, "n_positions": 512}}, 512),
    ],
)
def test_context_length_sources(tmp_path: Path, files: dict[str, Any], expected: int) -> None:
    assert load_model_dir(make_dir(tmp_path, files)).context_length == expected


def test_eos_ids_merged_from_all_sources(tmp_path: Path) -> None:
    files = {
        "config.json": {"eos_token_id": [258, 257]},
        "generation_config.json": {"eos_token_id": 256},
        "tokenizer_config.json": {"eos_token": "<|im_end|>"},
    }
    assert load_model_dir(make_dir(tmp_path, files)).eos_token_ids == (258, 257, 256)


def test_to_model_card() -> None:
    local = load_model_dir(TINY)
    card = to_model_card(local, "jetfleet-tiny/tokenizer.json")
    assert card.name == local.name
    assert card.tokenizer_object == "jetfleet-tiny/tokenizer.json"
    assert card.tokenizer_sha256 == hashlib.sha256(local.tokenizer_json).hexdigest()
    assert (card.context_length, card.block_size) == (8192, 16)
    assert (card.chat_template, card.eos_token_ids) == (local.chat_template, (258,))
    assert card.created_at_s > 0


def test_local_model_is_frozen() -> None:
    local: LocalModel = load_model_dir(TINY)
    with pytest.raises(AttributeError):
        local.name = "other"  # type: ignore[misc]


def test_matryoshka_dimensions_as_vllm_reads_them() -> None:
    from model.card import matryoshka_dimensions
    from router.frontend.embeddings import embedding_dimensions_check
    from router.frontend.errors import OpenAIError
    from schemas import ModelCard

    assert matryoshka_dimensions({}) is None
    assert matryoshka_dimensions({"is_matryoshka": True}) == ()
    assert matryoshka_dimensions({"matryoshka_dimensions": [768, 256]}) == (768, 256)
    assert load_model_dir(default_model_dir()).matryoshka_dimensions == ()  # the shipped card

    def card(dims: tuple[int, ...] | None) -> ModelCard:
        return ModelCard("m", 10, 16, "t", "s", hidden_size=64, matryoshka_dimensions=dims)

    embedding_dimensions_check(card(()), "m", 8)
    embedding_dimensions_check(card((32, 16)), "m", 16)
    for dims, asked, says in (
        (None, 8, "not a Matryoshka model"),
        ((), 65, "at most 64"),
        ((32, 16), 8, "one of 32, 16"),
    ):
        with pytest.raises(OpenAIError, match=says) as err:
            embedding_dimensions_check(card(dims), "m", asked)
        assert (err.value.status, err.value.param) == (400, "dimensions")
