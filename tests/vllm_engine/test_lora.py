"""LoRA on the real engine, through the fleet: an adapter made here with ``peft`` (random weights,
so its answers differ from the base model's) is loaded on one of two SmolLM2 workers through the
``lora_load`` control op, listed by ``/v1/models`` with its base as parent, used by naming it as
the ``model`` (vLLM's convention), routed only to the worker that holds it, and unloaded."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from openai import AsyncOpenAI, NotFoundError

from base.connect import close_nats, connect_nats
from schemas import RequestObservation
from tests.e2e.test_fleet_lifecycle import Observations
from tests.support.up import Up, wait_ready_workers
from tests.support.wait import wait_for
from tests.vllm_engine.conftest import START_TIMEOUT_S
from tests.vllm_engine.support import control

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

M = "SmolLM2-135M-Instruct"
ADAPTER = "smol-shouty"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def make_adapter(base: Path, out: Path) -> Path:
    """A rank-8 LoRA on the attention projections, seeded random and scaled up: it changes the
    model's answers (peft's default initialisation would leave them as they are)."""
    torch: Any = importlib.import_module("torch")
    transformers: Any = importlib.import_module("transformers")
    peft: Any = importlib.import_module("peft")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    config = peft.LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    torch.manual_seed(1)
    adapted = peft.get_peft_model(model, config)
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "lora_B" in name:
                param.mul_(50.0)
    adapted.save_pretrained(str(out))
    return out


def served(items: list[RequestObservation]) -> list[RequestObservation]:
    return [o for o in items if o.status == "ok"]


async def _answer(client: AsyncOpenAI, model: str) -> str:
    r = await client.chat.completions.create(
        model=model, messages=QUESTION, temperature=0, max_tokens=16
    )
    return r.choices[0].message.content or ""


async def test_an_adapter_is_loaded_used_routed_to_its_holder_and_unloaded(
    real_fleet: Up, smollm2: Path, tmp_path: Path
) -> None:
    adapter = make_adapter(smollm2, tmp_path / ADAPTER)
    workers = wait_ready_workers(real_fleet, 2, START_TIMEOUT_S)
    holder = workers[0]["worker_id"]
    nc = await connect_nats(real_fleet.nats_url, name="test")
    fleet = SimpleNamespace(nats_url=real_fleet.nats_url, prefix="fleet")
    try:
        async with AsyncOpenAI(base_url=f"{real_fleet.base_url}/v1", api_key="-") as client:
            base = await _answer(client, M)
            loaded = await control(nc, holder, "lora_load", name=ADAPTER, path=str(adapter))
            assert loaded.ok, loaded.detail

            async def listed_with_parent() -> bool:  # the frontend hears of it through discovery
                models = {m.id: m for m in (await client.models.list()).data}
                return ADAPTER in models and (models[ADAPTER].model_extra or {}).get("parent") == M

            await wait_for(listed_with_parent, timeout=10)
            async with Observations(fleet) as obs:  # type: ignore[arg-type]
                answers = [await _answer(client, ADAPTER) for _ in range(4)]
                await wait_for(lambda: len(served(obs.items)) == 4, timeout=30)
            # never the other worker; a request turned away (503, the client's retry then served
            # it) names no worker, and is shown should the holder be missing
            assert {o.worker_id for o in obs.items if o.worker_id} == {holder}, obs.items
            assert answers == [answers[0]] * 4 and answers[0] != base  # the adapter's answer
            listed = await control(nc, holder, "lora_list")
            assert listed.data["loras"] == [ADAPTER]
            unloaded = await control(nc, holder, "lora_unload", name=ADAPTER)
            assert unloaded.ok, unloaded.detail

            async def gone() -> bool:
                return ADAPTER not in {m.id for m in (await client.models.list()).data}

            await wait_for(gone, timeout=10)
            with pytest.raises(NotFoundError):
                await _answer(client, ADAPTER)
            assert await _answer(client, M) == base  # the base model is as it was
    finally:
        await close_nats(nc)
