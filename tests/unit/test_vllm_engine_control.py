"""VllmEngine over a fake ``AsyncLLM`` (``tests.support.vllm_fakes``): control ops (health,
sleep and wake, clear_kv, LoRA, an engine that dies) and its start and stop."""

from __future__ import annotations

import asyncio
import importlib
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

from schemas.kv_events import AllBlocksCleared
from tests.support.engines import Sink
from tests.support.vllm_fakes import (
    FakeBackend,
    config,
    push,
    request,
    request_output,
    started,
    submitted,
)
from tests.support.wait import wait_for
from workers.engine import EngineHooks
from workers.engines.vllm.backend import StartedLlm
from workers.engines.vllm.engine import VllmConfigMismatchError, VllmEngine


# ------------------------------------------------------------------------------- control
async def test_health() -> None:
    engine, backend = await started()
    res = await engine.control("health", {})
    assert res.ok and res.data["num_gpu_blocks"] == 1000 and res.data["sleeping"] is False
    backend.llm.unhealthy = RuntimeError("EngineDeadError")
    res = await engine.control("health", {})
    assert not res.ok and "EngineDeadError" in res.detail
    await engine.stop()


async def test_the_cpu_build_says_it_cannot_sleep_and_keeps_serving() -> None:
    backend = FakeBackend(on_cpu=True)
    engine = VllmEngine(config(enable_sleep_mode=True), backend)
    await engine.start(EngineHooks(lambda events: None))
    res = await engine.control("sleep", {})
    assert not res.ok and "CPU build cannot sleep" in res.detail
    assert backend.llm.slept == []  # vLLM was not asked
    assert (await engine.control("wake", {})).detail == "awake"
    health = await engine.control("health", {})
    assert health.data["sleeping"] is False
    await engine.stop()


async def _started_reporting_failures() -> tuple[VllmEngine, FakeBackend, list[str]]:
    """An engine on a fake backend, started; what it reports to ``EngineHooks.failed``."""
    failed: list[str] = []
    backend = FakeBackend()
    engine = VllmEngine(config(), backend)
    await engine.start(EngineHooks(lambda events: None, failed=failed.append))
    return engine, backend, failed


async def test_a_dead_engine_tells_the_worker_and_ends_nothing_it_held() -> None:
    engine, backend, failed = await _started_reporting_failures()
    held = await submitted(engine, backend, request("held"))
    backend.llm.errored = True  # vLLM's engine core died: every stream raises
    await push(backend, RuntimeError("EngineDeadError: EngineCore encountered an issue"))
    await wait_for(lambda: failed, timeout=2.0, interval=0.001)
    assert "EngineDeadError" in failed[0]
    assert held.final is None  # no error ending: the frontend migrates it elsewhere
    late = Sink()
    engine.add_request(request("late"), late)
    assert late.outputs == []
    await engine.stop()


async def test_an_idle_engine_that_dies_is_noticed() -> None:
    engine, backend, failed = await _started_reporting_failures()
    backend.llm.errored = True
    await wait_for(lambda: failed, timeout=3.0)
    assert failed == ["vLLM's engine core died"]
    await engine.stop()


async def test_sleep_holds_new_requests_until_wake() -> None:
    engine, backend = await started(enable_sleep_mode=True)
    busy = await submitted(engine, backend, request("busy"))
    assert not (await engine.control("sleep", {})).ok  # requests in flight
    await push(backend, request_output([1], finished=True, reason="stop"))
    await wait_for(lambda: busy.final, timeout=2.0, interval=0.001)
    res = await engine.control("sleep", {"level": "2"})
    assert res.ok and backend.llm.slept == [2]
    assert (await engine.control("health", {})).data["sleeping"] is True
    held = Sink()
    engine.add_request(request("held"), held)
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(backend.llm.calls) == 1  # not sent to vLLM while asleep
    assert (await engine.control("wake", {})).ok and len(backend.llm.woken) == 2
    assert backend.llm.rpcs == ["reload_weights"]  # level 2 discarded the weights
    await wait_for(lambda: len(backend.llm.calls) == 2, timeout=2.0, interval=0.001)
    assert not (await engine.control("sleep", {"level": "3"})).ok
    await engine.stop()


async def test_sleep_needs_sleep_mode() -> None:
    engine, backend = await started()
    res = await engine.control("sleep", {})
    assert not res.ok and backend.llm.slept == []
    await engine.stop()


@pytest.mark.parametrize(
    ("version", "vllm_result", "ok", "confirmed"),
    [
        ("0.33.0", True, True, True),
        ("0.12.0", False, False, None),  # blocks in use: vLLM refused
        ("0.11.2", None, True, False),  # vLLM does not say: not claimed as done
    ],
)
async def test_clear_kv_says_what_vllm_said(
    version: str, vllm_result: bool | None, ok: bool, confirmed: bool | None
) -> None:
    seen: list[Any] = []
    engine, backend = await started(version, seen.extend)
    backend.llm.reset_results = [vllm_result]
    res = await engine.control("clear_kv", {})
    assert res.ok is ok and res.data.get("confirmed") == confirmed, res
    # The fleet forgets the blocks at once only when vLLM confirmed the reset.
    assert seen == ([AllBlocksCleared()] if confirmed else [])
    await engine.stop()


async def test_clear_kv_on_old_vllm_refuses_while_requests_run() -> None:
    engine, backend = await started("0.11.2")
    await submitted(engine, backend, request())
    res = await engine.control("clear_kv", {})
    assert not res.ok and backend.llm.resets == 0  # vLLM would refuse with only a log line
    await engine.stop()


async def test_a_sleep_empties_the_fleets_view_and_0_10_0_resets_the_cache_first() -> None:
    for version, expected in (("0.10.0", ["reset", "sleep1"]), ("0.10.1", ["sleep1"])):
        seen: list[Any] = []
        engine, backend = await started(version, seen.extend, enable_sleep_mode=True)
        assert (await engine.control("sleep", {"level": "1"})).ok
        assert backend.llm.log == expected, version
        assert seen == [AllBlocksCleared()]
        assert (await engine.control("wake", {})).ok
        assert backend.llm.log[-1] == "wake" and backend.llm.rpcs == []  # level 1 kept weights
        await engine.stop()


async def test_a_failed_sleep_leaves_the_worker_serving() -> None:
    engine, backend = await started(enable_sleep_mode=True)
    backend.llm.sleep_error = RuntimeError("CuMem allocator not in use")
    res = await engine.control("sleep", {"level": "1"})
    assert not res.ok and "still serving" in res.detail
    assert (await engine.control("health", {})).data["sleeping"] is False
    sink = await submitted(engine, backend, request())  # reaches vLLM: not held for a wake
    await push(backend, request_output([3], finished=True, reason="stop"))
    await wait_for(lambda: sink.final, timeout=2.0, interval=0.001)
    await engine.stop()


async def test_level_2_wake_reloads_weights_before_the_cache() -> None:
    engine, backend = await started(enable_sleep_mode=True)
    assert (await engine.control("sleep", {"level": "2"})).ok
    res = await engine.control("wake", {})
    assert res.ok and "reloaded" in res.detail
    assert backend.llm.log[-3:] == ["wake['weights']", "reload_weights", "wake['kv_cache']"]
    await engine.stop()


async def test_start_refuses_a_block_size_vllm_overrode() -> None:
    backend = FakeBackend(block_size=64)
    engine = VllmEngine(config(block_size=16), backend)
    with pytest.raises(VllmConfigMismatchError, match=r"blocks of 64 tokens.*blocks of 16"):
        await engine.start(EngineHooks(lambda events: None))
    assert backend.llm.shut_down


async def test_start_refuses_a_vllm_below_the_floor() -> None:
    engine = VllmEngine(config(), FakeBackend(version="0.9.2"))
    with pytest.raises(ValueError, match="older than the supported floor"):
        await engine.start(EngineHooks(lambda events: None))


async def test_vllm_is_built_off_the_event_loop() -> None:
    release = threading.Event()
    loop_thread = threading.get_ident()
    threads: list[int] = []

    class SlowBackend(FakeBackend):
        def start_llm(self, *args: Any) -> StartedLlm:
            threads.append(threading.get_ident())
            release.wait(5.0)  # weights loading: minutes on a GPU, blocking
            return super().start_llm(*args)

    engine = VllmEngine(config(), SlowBackend())
    starting = asyncio.create_task(engine.start(EngineHooks(lambda events: None)))
    ticks = 0
    while not threads:  # the loop keeps running while vLLM is being built
        ticks += 1
        await asyncio.sleep(0.001)
    for _ in range(20):
        ticks += 1
        await asyncio.sleep(0)
    assert not starting.done() and ticks > 20
    release.set()
    await starting
    assert threads[0] != loop_thread
    await engine.stop()


async def test_lora_load_list_unload() -> None:
    engine, backend = await started(enable_lora=True)
    assert not (await engine.control("lora_load", {"name": "a"})).ok  # no path
    a = await engine.control("lora_load", {"name": "a", "path": "/a"})
    b = await engine.control("lora_load", {"name": "b", "path": "/b"})
    assert a.ok and b.ok and a.data["lora_id"] != b.data["lora_id"]
    assert (await engine.control("lora_load", {"name": "a", "path": "/a"})).ok  # idempotent
    assert (await engine.control("lora_list", {})).data == {"loras": ["a", "b"]}
    assert (await engine.control("lora_unload", {"name": "a"})).ok
    assert not (await engine.control("lora_unload", {"name": "a"})).ok
    assert (await engine.control("lora_list", {})).data == {"loras": ["b"]}
    assert set(backend.llm.loras) == {b.data["lora_id"]}
    await engine.stop()


async def test_lora_needs_enable_lora() -> None:
    engine, backend = await started()
    assert not (await engine.control("lora_load", {"name": "a", "path": "/a"})).ok
    assert backend.llm.loras == {}
    await engine.stop()


async def test_unknown_op_kv_resync_without_events_and_before_start() -> None:
    engine, _ = await started()
    assert not (await engine.control("defragment", {})).ok
    assert not (await engine.control("kv_resync", {})).ok  # KV events off
    await engine.stop()
    idle = VllmEngine(config(), FakeBackend())
    assert not (await idle.control("health", {})).ok


async def test_stop_cancels_requests_and_shuts_vllm_down() -> None:
    engine, backend = await started()
    await submitted(engine, backend, request())
    vllm_id = backend.llm.calls[0]["id"]
    await engine.stop()
    assert backend.llm.shut_down and vllm_id in backend.llm.aborted


def test_without_vllm_construction_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.engines.vllm import backend as backend_module
    from workers.engines.vllm.backend import VllmNotInstalledError

    real_import = importlib.import_module

    def without_vllm(name: str, package: str | None = None) -> Any:
        if name == "vllm" or name.startswith("vllm."):  # as on a machine without vLLM
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import(name, package)

    monkeypatch.setattr(backend_module.importlib, "import_module", without_vllm)

    with pytest.raises(VllmNotInstalledError, match=r"bootstrap\.sh vllm"):
        VllmEngine(config())


async def test_a_failed_start_leaves_no_socket_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    short = Path(tempfile.mkdtemp(prefix="jf-"))  # ipc paths must stay short
    monkeypatch.setattr(tempfile, "tempdir", str(short))

    class FailingBackend(FakeBackend):
        def start_llm(self, *args: Any) -> StartedLlm:
            raise RuntimeError("CUDA out of memory")

    engine = VllmEngine(config(kv_events=True), FailingBackend())
    try:
        with pytest.raises(RuntimeError, match="out of memory"):
            await engine.start(EngineHooks(lambda events: None))
        assert os.listdir(short) == []
    finally:
        shutil.rmtree(short, ignore_errors=True)
