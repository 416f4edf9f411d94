"""Fixtures for the real-engine tests (marker ``vllm``).

They need vLLM installed (``bash infra/bootstrap.sh vllm``; ``bootstrap.sh test`` installs it and
sets ``JETFLEET_REQUIRE_VLLM=1``, under which a missing vLLM fails these tests instead of skipping
them). The models are built once into the user's cache (``infra/vllm_models.py``): SmolLM2-135M-
Instruct, real weights, for answers; ``jetfleet-tiny-llama``, random weights, for plumbing.

``real_fleet`` is ``jetfleet up --engine vllm`` as a user starts it, shared by the session: two
SmolLM2 workers with LoRA on and a small KV cache (256 blocks of 32 tokens each, so eviction is
reachable), the KV router, the indexer and the router service, on embedded NATS and Redis. It is
stopped with Ctrl-C at the end, and no vLLM process may outlive it.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.up import Up, running_up
from tests.vllm_engine.support import engine_processes

# first start of a real engine, on a loaded 2-core machine (measured: 20-60 s each)
START_TIMEOUT_S = 600.0
REAL_FLEET_BLOCKS = 256


def _vllm_missing() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (bash infra/bootstrap.sh vllm)"
    return None


@pytest.fixture(scope="session", autouse=True)
def _needs_vllm() -> None:
    """Session-scoped, so it runs before the session's fleets start (a function-scoped check
    would come after them, and the tests would error instead of skipping)."""
    missing = _vllm_missing()
    if missing is None:
        return
    if os.environ.get("JETFLEET_REQUIRE_VLLM") == "1":
        pytest.fail(missing + ", and JETFLEET_REQUIRE_VLLM=1")
    pytest.skip(missing)


@pytest.fixture(scope="session")
def smollm2(_needs_vllm: None) -> Path:
    from infra.vllm_models import ensure

    return ensure("smollm2")


@pytest.fixture(scope="session")
def tiny_llama(_needs_vllm: None) -> Path:
    from infra.vllm_models import ensure

    return ensure("tiny-llama")


@pytest.fixture(scope="session")
def real_fleet(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    tmp = tmp_path_factory.mktemp("real-fleet")
    with running_up(
        tmp, 2, "--engine", "vllm", "--model", str(smollm2), "--enable-lora",
        "--vllm-arg", f"num_gpu_blocks_override={REAL_FLEET_BLOCKS}",
        "--max-model-len", "4096",
        # unpinned: on the test machine three pytest workers share the 2 cores with these
        # engines, and a pinned engine cannot leave a busy core (the pin: test_cpu_placement)
        "--cpu-cores", "none",
        start_timeout_s=START_TIMEOUT_S,
    ) as fleet:  # fmt: skip
        yield fleet
    # Ctrl-C stopped every process, vLLM's engine processes included
    assert engine_processes() == [], "vLLM processes outlived jetfleet up"
