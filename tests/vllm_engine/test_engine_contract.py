"""The engine contract (``tests.support.engine_contract``) against vLLM's real engine, in this
process: ``VllmEngine`` over the tiny Llama (random weights, the shipped byte-level tokenizer;
fast on a CPU), KV events on. vLLM's CPU build pages KV in blocks of 32 tokens. The same suite
runs against the mocker in ``tests/unit/test_engine_contract.py``."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.engine_contract import EngineContract, Started
from tests.support.tokenizers import shipped_tokenizer
from tests.support.wait import wait_until
from tests.vllm_engine.support import engine_processes, title

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
async def started(tiny_llama: Path) -> AsyncIterator[Started]:
    from workers.engines.vllm.config import VllmEngineConfig
    from workers.engines.vllm.engine import VllmEngine

    config = VllmEngineConfig(
        model=str(tiny_llama), block_size=32, max_model_len=1024, max_num_seqs=8
    )
    vocab = shipped_tokenizer().text_safe_token_ids()  # the tiny Llama's tokenizer
    # Starting, the backend sets what vLLM's CPU build needs in this process's environment (and
    # marks this process the owner of vLLM's): put it back after, for the tests that follow.
    environ = dict(os.environ)
    try:
        async with Started.run(VllmEngine(config), vocab, timeout_s=120.0) as running:
            yield running
        wait_until(lambda: not _vllm_processes(), 60, "vLLM's processes gone")
    finally:
        os.environ.clear()
        os.environ.update(environ)


def _vllm_processes() -> list[int]:
    """vLLM's own processes under this one (``VLLM::EngineCore``, ``VLLM::Worker``; not the
    multiprocessing resource tracker, which lives as long as this process)."""
    return [pid for pid in engine_processes(os.getpid()) if title(pid).startswith("VLLM")]


class TestVllmEngine(EngineContract):
    pass
