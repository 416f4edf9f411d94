"""VllmEngine over a fake ``AsyncLLM``: request mapping, delta outputs, finish reasons, abort,
load and control ops. The fake yields objects with the ``RequestOutput`` attributes the adapter
reads (``outputs[0].token_ids``, ``outputs[0].finish_reason``, ``finished``,
``num_cached_tokens``), as vLLM does with ``RequestOutputKind.DELTA``."""

from __future__ import annotations

import asyncio
import importlib
import os
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from schemas.kv_events import AllBlocksCleared
from schemas.requests import SamplingParams, StructuredOutput
from schemas.tokens import TokenLogprob
from tests.support.engines import Sink
from tests.support.wait import wait_for
from workers.engine import EngineHooks, EngineRequest
from workers.engines.vllm.backend import StartedLlm
from workers.engines.vllm.config import KvEventsEndpoints, VllmEngineConfig
from workers.engines.vllm.engine import VllmConfigMismatchError, VllmEngine
from workers.engines.vllm.stats import SchedulerStatsCollector

END = object()  # ends a fake stream without a finished output


def request_output(
    tokens: Sequence[int],
    finished: bool = False,
    reason: str | None = None,
    cached: int | None = 0,
    kv_transfer_params: dict[str, Any] | None = None,
    logprobs: list[dict[int, Any]] | None = None,
    prompt_logprobs: list[dict[int, Any] | None] | None = None,
) -> SimpleNamespace:
    completion = SimpleNamespace(token_ids=list(tokens), finish_reason=reason, logprobs=logprobs)
    return SimpleNamespace(
        outputs=[completion],
        finished=finished,
        num_cached_tokens=cached,
        kv_transfer_params=kv_transfer_params,
        prompt_logprobs=prompt_logprobs,
    )


def lp(logprob: float, rank: int) -> SimpleNamespace:
    """vLLM's ``Logprob(logprob, rank, decoded_token)``."""
    return SimpleNamespace(logprob=logprob, rank=rank, decoded_token=None)


class FakeLLM:
    """The ``AsyncLLM`` methods the adapter calls; each request's outputs are pushed by the test."""

    def __init__(self) -> None:
        self.streams: dict[str, asyncio.Queue[Any]] = {}
        self.calls: list[dict[str, Any]] = []
        self.aborted: list[str] = []
        self.reset_results: list[bool | None] = []
        self.slept: list[int] = []
        self.sleep_error: Exception | None = None
        self.woken: list[list[str] | None] = []
        self.rpcs: list[str] = []
        self.resets = 0
        self.log: list[str] = []  # the order of cache and sleep calls
        self.unhealthy: Exception | None = None
        self.loras: dict[int, Any] = {}
        self.shut_down = False
        self.errored = False  # AsyncLLM.errored: its engine core died

    def queue(self, vllm_id: str) -> asyncio.Queue[Any]:
        return self.streams.setdefault(vllm_id, asyncio.Queue())

    async def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, lora_request: Any = None
    ) -> AsyncIterator[Any]:
        self.calls.append(
            {"prompt": prompt, "params": sampling_params, "id": request_id, "lora": lora_request}
        )
        q = self.queue(request_id)
        while True:
            item = await q.get()
            if item is END:
                return
            if isinstance(item, Exception):
                raise item
            yield item

    async def encode(
        self, prompt: Any, pooling_params: Any, request_id: str, lora_request: Any = None
    ) -> AsyncIterator[Any]:
        self.calls.append(
            {"prompt": prompt, "params": pooling_params, "id": request_id, "lora": lora_request}
        )
        q = self.queue(request_id)
        while True:
            item = await q.get()
            if item is END:
                return
            yield item

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def reset_prefix_cache(self) -> bool | None:
        self.resets += 1
        self.log.append("reset")
        return self.reset_results.pop(0) if self.reset_results else True

    async def sleep(self, level: int) -> None:
        if self.sleep_error is not None:
            raise self.sleep_error
        self.log.append(f"sleep{level}")
        self.slept.append(level)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        self.log.append(f"wake{tags or ''}")
        self.woken.append(tags)

    async def collective_rpc(self, method: str) -> list[Any]:
        self.log.append(method)
        self.rpcs.append(method)
        return [None]

    async def is_sleeping(self) -> bool:
        return bool(self.slept) and len(self.woken) < len(self.slept)

    async def check_health(self) -> None:
        if self.unhealthy is not None:
            raise self.unhealthy

    def get_num_unfinished_requests(self) -> int:
        return len(self.streams)

    async def add_lora(self, lora: Any) -> bool:
        self.loras[lora[2]] = lora
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        return self.loras.pop(lora_id, None) is not None

    async def list_loras(self) -> set[int]:
        return set(self.loras)

    def shutdown(self) -> None:
        self.shut_down = True


@dataclass
class FakeBackend:
    llm: FakeLLM = field(default_factory=FakeLLM)
    stats: SchedulerStatsCollector | None = None
    kv: KvEventsEndpoints | None = None
    version: str = "0.33.0"
    block_size: int | None = None  # what vLLM settled on (None: as configured)
    on_cpu: bool = False

    def start_llm(
        self, config: VllmEngineConfig, kv: KvEventsEndpoints | None, stats: SchedulerStatsCollector
    ) -> StartedLlm:
        self.stats, self.kv = stats, kv
        size = config.block_size if self.block_size is None else self.block_size
        return StartedLlm(self.llm, 1000, size, self.version, self.on_cpu)

    def sampling_params(self, kwargs: dict[str, Any]) -> Any:
        if kwargs["temperature"] < 0:
            raise ValueError("temperature must be non-negative")
        return {**kwargs, "output_kind": "DELTA"}

    def tokens_prompt(self, token_ids: Sequence[int]) -> Any:
        return {"prompt_token_ids": list(token_ids)}

    def pooling_params(self, dimensions: int | None) -> Any:
        return {"task": "embed", "dimensions": dimensions}

    def embeds_prompt(self, data: bytes) -> tuple[Any, int]:
        return {"prompt_embeds": data}, 7  # the real one: torch.load, 7 positions here

    def lora_request(self, name: str, lora_id: int, path: str) -> Any:
        return ("lora", name, lora_id, path)


def config(**overrides: Any) -> VllmEngineConfig:
    base: dict[str, Any] = {"model": "m", "kv_events": False, "max_num_seqs": 8}
    return VllmEngineConfig(**(base | overrides))


async def started(
    version: str = "0.33.0", listener: Any = None, **overrides: Any
) -> tuple[VllmEngine, FakeBackend]:
    backend = FakeBackend(version=version)
    engine = VllmEngine(config(**overrides), backend)
    await engine.start(EngineHooks(listener or (lambda events: None)))
    return engine, backend


def request(rid: str = "r1", n_prompt: int = 5, **sampling: Any) -> EngineRequest:
    sp = SamplingParams(**({"max_tokens": 4} | sampling))
    return EngineRequest(rid, tuple(range(1, n_prompt + 1)), sp)


async def submitted(engine: VllmEngine, backend: FakeBackend, req: EngineRequest) -> Sink:
    sink = Sink()
    before = len(backend.llm.calls)
    engine.add_request(req, sink)
    await wait_for(lambda: len(backend.llm.calls) > before, timeout=2.0, interval=0.001)
    return sink


async def push(backend: FakeBackend, item: Any, call: int = -1) -> None:
    await backend.llm.queue(backend.llm.calls[call]["id"]).put(item)


# ------------------------------------------------------------------------------ requests
async def test_request_reaches_generate_as_tokens_and_delta_params() -> None:
    engine, backend = await started()
    req = EngineRequest(
        "r1",
        (5, 6, 7),
        SamplingParams(max_tokens=3, temperature=0.5, top_p=0.9, seed=7, stop_token_ids=(2,)),
        kv_transfer_params={"do_remote_decode": True},
    )
    await submitted(engine, backend, req)
    call = backend.llm.calls[0]
    assert call["prompt"] == {"prompt_token_ids": [5, 6, 7]}
    assert call["params"]["output_kind"] == "DELTA"
    assert call["params"]["max_tokens"] == 3 and call["params"]["seed"] == 7
    assert call["params"]["extra_args"] == {"kv_transfer_params": {"do_remote_decode": True}}
    assert call["id"].startswith("r1-") and call["lora"] is None
    await engine.stop()


async def test_logprobs_come_back_as_ours_in_rank_order() -> None:
    """vLLM gives, per position, the top-k by rank plus the sampled token (possibly ranked
    lower); the prompt's come once, with None for the first token."""
    engine, backend = await started()
    sp = SamplingParams(max_tokens=2, logprobs=2, prompt_logprobs=1)
    sink = await submitted(engine, backend, EngineRequest("r1", (5, 6), sp))
    params = backend.llm.calls[0]["params"]
    assert (params["logprobs"], params["prompt_logprobs"]) == (2, 1)
    first = {10: lp(-0.1, 1), 30: lp(-2.5, 2)}
    second = {11: lp(-4.0, 7), 31: lp(-0.2, 1), 32: lp(-1.9, 2)}  # sampled 11, ranked 7th
    prompt = [None, {6: lp(-3.0, 4), 9: lp(-0.5, 1)}]
    await push(backend, request_output([10], logprobs=[first], prompt_logprobs=prompt))
    await push(backend, request_output([11], True, "length", logprobs=[second]))
    await wait_for(lambda: sink.final, timeout=2.0, interval=0.001)
    got = [o.logprobs for o in sink.outputs]
    assert got[0] == (TokenLogprob(-0.1, (10, 30), (-0.1, -2.5)),)
    assert got[1] == (TokenLogprob(-4.0, (31, 32), (-0.2, -1.9)),)
    assert sink.outputs[0].prompt_logprobs == (None, TokenLogprob(-3.0, (9,), (-0.5,)))
    assert sink.outputs[1].prompt_logprobs is None
    await engine.stop()


async def test_a_constraint_goes_under_the_releases_name() -> None:
    schema = '{"type": "object"}'
    sp = SamplingParams(max_tokens=2, structured=StructuredOutput(json_schema=schema))
    for version, name in (("0.33.0", "structured_outputs"), ("0.10.2", "guided_decoding")):
        engine, backend = await started(version=version)
        await submitted(engine, backend, EngineRequest("r", (5,), sp))
        assert backend.llm.calls[0]["params"][name] == {"json": schema}
        await engine.stop()


async def test_an_embedding_worker_encodes_and_a_generating_one_refuses() -> None:
    engine, backend = await started(extra_engine_args={"runner": "pooling"})
    assert engine.tasks == ("embed",)
    req = EngineRequest("e", (5, 6), SamplingParams(max_tokens=1), task="embed", dimensions=3)
    sink = await submitted(engine, backend, req)
    assert backend.llm.calls[0]["params"] == {"task": "embed", "dimensions": 3}
    pooled = SimpleNamespace(data=SimpleNamespace(tolist=lambda: [0.6, 0.0, 0.8]))
    await push(backend, SimpleNamespace(outputs=pooled, finished=True, num_cached_tokens=0))
    await wait_for(lambda: sink.final, timeout=2.0, interval=0.001)
    assert sink.final is not None and sink.final.embedding == (0.6, 0.0, 0.8)
    assert sink.final.finish_reason == "stop"
    generate = EngineRequest("g", (5,), SamplingParams(max_tokens=1))
    refused = Sink()
    engine.add_request(generate, refused)
    assert refused.final is not None and "does not generate" in (refused.final.error or "")
    await engine.stop()
    plain, _ = await started()
    assert plain.tasks == ("generate",)
    await plain.stop()


async def test_prompt_embeds_reach_vllm_as_an_embeds_prompt() -> None:
    engine, backend = await started(extra_engine_args={"enable_prompt_embeds": True})
    assert engine.tasks == ("generate", "prompt_embeds")
    req = EngineRequest("p", (), SamplingParams(max_tokens=1), prompt_embeds=b"tensor")
    sink = await submitted(engine, backend, req)
    assert backend.llm.calls[0]["prompt"] == {"prompt_embeds": b"tensor"}
    await push(backend, request_output([10], finished=True, reason="length"))
    await wait_for(lambda: sink.final, timeout=2.0, interval=0.001)
    assert sink.final is not None and sink.final.num_prompt_tokens == 7
    await engine.stop()
    plain, _ = await started()
    refused = Sink()
    plain.add_request(req, refused)
    assert refused.final is not None and "enable_prompt_embeds" in (refused.final.error or "")
    await plain.stop()


async def test_delta_outputs_go_to_the_sink_in_order() -> None:
    engine, backend = await started()
    sink = await submitted(engine, backend, request(n_prompt=5))
    await push(backend, request_output([10], cached=4))
    await push(backend, request_output([11, 12]))
    await push(backend, request_output([13], finished=True, reason="length"))
    await wait_for(lambda: sink.final, timeout=2.0, interval=0.001)
    assert sink.tokens == [10, 11, 12, 13]
    assert [o.finished for o in sink.outputs] == [False, False, True]
    assert sink.final is not None and sink.final.finish_reason == "length"
    assert all(o.num_prompt_tokens == 5 for o in sink.outputs)
    assert sink.outputs[0].num_cached_tokens == 4
    load = engine.load()
    assert (load.prompt_tokens_total, load.cached_tokens_total) == (5, 4)
    assert load.active_prefill_tokens == 0 and load.num_running + load.num_waiting == 0
    await engine.stop()


@pytest.mark.parametrize(
    ("vllm_reason", "ours", "has_error"),
    [
        ("stop", "stop", False),
        ("length", "length", False),
        ("abort", "abort", False),
        ("error", "error", True),
        (None, "stop", False),
        ("something-new", "stop", False),
    ],
)
async def test_finish_reasons(vllm_reason: str | None, ours: str, has_error: bool) -> None:
    engine, backend = await started()
    sink = await submitted(engine, backend, request())
    await push(backend, request_output([1], finished=True, reason=vllm_reason))
    final = await wait_for(lambda: sink.final, timeout=2.0, interval=0.001)
    assert final.finish_reason == ours
    assert (final.error is not None) == has_error
    await engine.stop()


async def test_an_exception_from_vllm_ends_the_request_with_its_message() -> None:
    engine, backend = await started()
    sink = await submitted(engine, backend, request())
    await push(backend, request_output([1]))
    await push(backend, RuntimeError("EngineCore died"))
    final = await wait_for(lambda: sink.final, timeout=2.0, interval=0.001)
    assert final.finish_reason == "error"
    assert final.error is not None and "EngineCore died" in final.error
    assert engine.load().num_waiting == 0
    await engine.stop()


async def test_a_stream_that_ends_unfinished_is_an_error() -> None:
    engine, backend = await started()
    sink = await submitted(engine, backend, request())
    await push(backend, END)
    final = await wait_for(lambda: sink.final, timeout=2.0, interval=0.001)
    assert final.finish_reason == "error"
    await engine.stop()


async def test_abort_ends_at_once_and_aborts_in_vllm() -> None:
    engine, backend = await started()
    sink = await submitted(engine, backend, request(n_prompt=7))
    vllm_id = backend.llm.calls[0]["id"]
    assert engine.load().active_prefill_tokens == 7
    assert engine.abort("r1") is True
    assert sink.final is not None and sink.final.finish_reason == "abort"
    await wait_for(lambda: vllm_id in backend.llm.aborted, timeout=2.0, interval=0.001)
    await push(backend, request_output([99]))  # too late: nobody listens
    await asyncio.sleep(0)
    assert sink.tokens == [] and len(sink.outputs) == 1
    assert engine.abort("r1") is False and engine.abort("nope") is False
    assert engine.load().active_prefill_tokens == 0
    await engine.stop()


async def test_a_newer_attempt_replaces_the_running_one() -> None:
    engine, backend = await started()
    old = await submitted(engine, backend, request())
    new = await submitted(engine, backend, request())
    first, second = (c["id"] for c in backend.llm.calls)
    assert first != second
    assert old.final is not None and old.final.finish_reason == "abort"
    await push(backend, request_output([5], finished=True, reason="stop"))
    await wait_for(lambda: new.final, timeout=2.0, interval=0.001)
    assert new.tokens == [5]
    await engine.stop()


async def test_bad_requests_end_with_an_error_without_reaching_vllm() -> None:
    engine, backend = await started(enable_lora=True)
    unknown_lora = Sink()
    engine.add_request(
        EngineRequest("a", (1, 2), SamplingParams(max_tokens=1), lora_name="nope"), unknown_lora
    )
    bad_params = Sink()
    engine.add_request(request("b", temperature=-1.0), bad_params)
    for sink in (unknown_lora, bad_params):
        assert sink.final is not None and sink.final.finish_reason == "error"
    assert unknown_lora.final is not None and "nope" in (unknown_lora.final.error or "")
    assert backend.llm.calls == []
    assert engine.load().active_prefill_tokens == 0
    await engine.stop()


async def test_a_loaded_lora_is_passed_with_the_request() -> None:
    engine, backend = await started(enable_lora=True)
    res = await engine.control("lora_load", {"name": "sql", "path": "/adapters/sql"})
    assert res.ok, res.detail
    req = EngineRequest("r", (1, 2), SamplingParams(max_tokens=1), lora_name="sql")
    await submitted(engine, backend, req)
    assert backend.llm.calls[0]["lora"] == ("lora", "sql", res.data["lora_id"], "/adapters/sql")
    await engine.stop()


# ---------------------------------------------------------------------------------- load
async def test_load_reads_scheduler_stats_and_own_counts() -> None:
    engine, backend = await started()
    assert backend.stats is not None
    await submitted(engine, backend, request("a", n_prompt=10))
    await submitted(engine, backend, request("b", n_prompt=6))
    await submitted(engine, backend, request("c", n_prompt=3))
    backend.stats.record(
        SimpleNamespace(num_running_reqs=2, num_waiting_reqs=1, kv_cache_usage=0.25),
        SimpleNamespace(num_preempted_reqs=1),
    )
    await push(backend, request_output([1], cached=8), call=0)  # a: prefilled
    await wait_for(lambda: engine.load().active_prefill_tokens == 9, timeout=2.0, interval=0.001)
    load = engine.load()
    assert (load.num_running, load.num_waiting) == (2, 1)
    assert load.kv_usage == 0.25 and load.num_gpu_blocks == 1000
    assert load.active_decode_blocks == 250
    assert load.num_preempted_total == 1 and load.max_num_seqs == 8
    assert (load.prompt_tokens_total, load.cached_tokens_total) == (10, 8)
    await engine.stop()


async def test_load_counts_requests_vllm_has_not_reported_yet_as_waiting() -> None:
    engine, backend = await started()
    await submitted(engine, backend, request("a"))
    load = engine.load()  # no stats record yet
    assert (load.num_running, load.num_waiting) == (0, 1)
    await engine.stop()


def test_stats_collector_reads_kv_usage_preemptions_and_step_time() -> None:
    now = [0.0]
    c = SchedulerStatsCollector(clock=lambda: now[0])
    busy = SimpleNamespace(num_running_reqs=3, num_waiting_reqs=0, kv_cache_usage=0.5)
    c.record(busy, None)
    now[0] = 0.02
    c.record(busy, SimpleNamespace(num_preempted_reqs=2))
    s = c.snapshot()
    assert s.kv_usage == 0.5 and s.num_preempted_total == 2
    assert s.step_ms == pytest.approx(20.0)
    now[0] = 5.0
    c.record(SimpleNamespace(num_running_reqs=0, num_waiting_reqs=0, kv_cache_usage=0.0), None)
    assert c.snapshot().step_ms == 0.0 and c.snapshot().records == 3


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


async def test_a_dead_engine_tells_the_worker_and_ends_nothing_it_held() -> None:
    failed: list[str] = []
    backend = FakeBackend()
    engine = VllmEngine(config(), backend)
    await engine.start(EngineHooks(lambda events: None, failed=failed.append))
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
    failed: list[str] = []
    backend = FakeBackend()
    engine = VllmEngine(config(), backend)
    await engine.start(EngineHooks(lambda events: None, failed=failed.append))
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


async def test_final_output_carries_vllms_kv_transfer_params() -> None:
    engine, backend = await started()
    sink = await submitted(engine, backend, request())
    params = {"do_remote_prefill": True, "remote_block_ids": [1, 2], "remote_engine_id": "e"}
    await push(backend, request_output([7], True, "length", kv_transfer_params=params))
    final = await wait_for(lambda: sink.final, timeout=2.0, interval=0.001)
    assert final.kv_transfer_params == params
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
