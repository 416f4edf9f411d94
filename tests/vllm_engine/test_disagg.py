"""Disaggregated serving on real engines: ``jetfleet up --disagg --engine vllm`` with vLLM's
``ExampleConnector`` (KV through shared storage, the one connector of vLLM's CPU build that moves
KV between engines; NIXL needs a GPU). The prefill worker computes the prompt and stores its KV;
the decode worker loads it (vLLM counts those tokens as cached) and answers from it: a wrong or
partial transfer would not give the right answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from tests.support.up import Up, running_up
from tests.vllm_engine.conftest import START_TIMEOUT_S

# slow: two vLLM engines and a file handoff, ~2.5 min of CI (docs/development/testing.md)
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

M = "SmolLM2-135M-Instruct"
BLOCK = 32


@pytest.fixture(scope="module")
def disagg_fleet(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    tmp = tmp_path_factory.mktemp("disagg")
    transfer = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(tmp / "kv")},
    }
    with running_up(
        tmp, 2, "--disagg", "--engine", "vllm", "--model", str(smollm2), "--max-model-len", "2048",
        "--disagg-isl-threshold", "256", "--prefill-timeout", "300",
        "--vllm-arg", f"kv_transfer_config={json.dumps(transfer)}",
        start_timeout_s=START_TIMEOUT_S,
    ) as fleet:  # fmt: skip
        yield fleet


async def test_the_decode_worker_answers_from_the_prefill_workers_kv(disagg_fleet: Up) -> None:
    notes = " ".join(f"Note {i}: the archive keeps old letters and maps." for i in range(40))
    messages = [
        {"role": "system", "content": "You are a helpful assistant. Background: " + notes},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    async with AsyncOpenAI(base_url=f"{disagg_fleet.base_url}/v1", api_key="-") as client:
        r = await client.chat.completions.create(
            model=M, messages=messages, temperature=0, max_tokens=20
        )
    assert "Paris" in (r.choices[0].message.content or "")
    usage = r.usage
    assert usage is not None and usage.prompt_tokens > 400  # over the remote-prefill threshold
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    # every full block of the prompt came from the prefill worker's KV
    assert cached == (usage.prompt_tokens - 1) // BLOCK * BLOCK, usage
    log = (disagg_fleet.log.parent / "state" / "logs" / "prefill-0.log").read_text()
    assert f'"request_id": "{r.id}-prefill"' in log  # the prefill worker did prefill it
