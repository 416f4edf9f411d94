"""The engine contract (``tests.support.engine_contract``) against the mocker; the same suite runs
against vLLM in ``tests/vllm_engine/test_engine_contract.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.engine_contract import EngineContract, Started
from tests.support.tokenizers import shipped_tokenizer
from workers.engines.mocker.config import MockerConfig
from workers.engines.mocker.engine import MockerEngine


@pytest.fixture(scope="module")
async def started() -> AsyncIterator[Started]:
    tok = shipped_tokenizer()
    vocab = tok.text_safe_token_ids()
    config = MockerConfig(num_gpu_blocks=256, max_num_seqs=8, speedup=100.0)
    async with Started.run(MockerEngine(config, vocab, tok.encode), vocab) as engine:
        yield engine


class TestMockerEngine(EngineContract):
    pass
