"""VllmEngine over a fake ``AsyncLLM`` (``tests.support.vllm_fakes``): request mapping, delta
outputs, finish reasons, abort, the final output's KV transfer parameters, load."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from schemas.requests import SamplingParams, StructuredOutput
from schemas.tokens import TokenLogprob
from tests.support.engines import Sink
from tests.support.vllm_fakes import (
    END,
    lp,
    push,
    request,
    request_output,
    started,
    submitted,
)
from tests.support.wait import wait_for
from workers.engine import EngineRequest
from workers.engines.vllm.stats import SchedulerStatsCollector


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


async def test_final_output_carries_vllms_kv_transfer_params() -> None:
    engine, backend = await started()
    sink = await submitted(engine, backend, request())
    params = {"do_remote_prefill": True, "remote_block_ids": [1, 2], "remote_engine_id": "e"}
    await push(backend, request_output([7], True, "length", kv_transfer_params=params))
    final = await wait_for(lambda: sink.final, timeout=2.0, interval=0.001)
    assert final.kv_transfer_params == params
    await engine.stop()
