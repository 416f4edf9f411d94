"""Embeddings computed by vLLM's pooling runner, through the fleet's ``/v1/embeddings``, checked
against an independent computation: transformers' last hidden state of the last token,
normalized (vLLM's pooling for a causal LM). A tiny-Llama worker started with
``--vllm-arg runner=pooling``."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from tests.support.up import Up, running_up
from tests.vllm_engine.conftest import START_TIMEOUT_S

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

M = "tiny-embed"


@pytest.fixture(scope="module")
def embed_fleet(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with running_up(
        tmp_path_factory.mktemp("embed"), 1, "--engine", "vllm", "--model", str(tiny_llama),
        "--served-model-name", M, "--vllm-arg", "runner=pooling", "--max-model-len", "1024",
        start_timeout_s=START_TIMEOUT_S,
    ) as fleet:  # fmt: skip
        yield fleet


def _reference(model_dir: Path, text: str) -> list[float]:
    torch: Any = importlib.import_module("torch")
    transformers: Any = importlib.import_module("transformers")
    model = transformers.AutoModel.from_pretrained(str(model_dir), dtype=torch.float32)
    ids = torch.tensor([list(text.encode())])  # the byte tokenizer: one id per byte
    with torch.no_grad():
        last = model(input_ids=ids).last_hidden_state[0, -1]
    return [float(x) for x in last / last.norm()]


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (sum(x * x for x in a) ** 0.5 * sum(y * y for y in b) ** 0.5)


async def test_embeddings_are_vllms_pooled_vectors(embed_fleet: Up, tiny_llama: Path) -> None:
    texts = ["hello world", "the sky is blue"]
    async with AsyncOpenAI(base_url=f"{embed_fleet.base_url}/v1", api_key="-") as client:
        r = await client.embeddings.create(model=M, input=texts)
        again = await client.embeddings.create(model=M, input=texts[0])
    vectors = [d.embedding for d in r.data]
    assert [len(v) for v in vectors] == [128, 128]  # the model's hidden size
    for text, vector in zip(texts, vectors, strict=True):
        assert _cosine(vector, _reference(tiny_llama, text)) > 0.999
    assert _cosine(vectors[0], vectors[1]) < 0.99  # different texts, different vectors
    assert again.data[0].embedding == pytest.approx(vectors[0], abs=1e-5)
    assert r.usage.prompt_tokens == len("hello world") + len("the sky is blue")
