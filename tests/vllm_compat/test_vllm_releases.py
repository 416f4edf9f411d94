"""The vLLM worker against vLLM's own code, release by release (``versions.TESTED_RELEASES``:
the floor, the last release before the replay format changed, the latest).

For each release, vLLM's real modules (``sources.py``: fetched from PyPI, cached) drive the
adapter: its event structs encoded by its own encoder into our decoder; its ``ZmqEventPublisher``
(threads, PUB and replay ROUTER) against our subscriber, with a gap that only its replay can fill;
its ``SamplingParams`` built by our backend from our requests. What cannot be imported without
torch and CUDA (``AsyncLLM``, the engine arguments, the stats) is parsed from the release's source
and checked for every method, parameter and field the adapter uses, and for the facts of
``versions.py``.
"""

from __future__ import annotations

import ast
import asyncio
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio

from schemas.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from schemas.requests import SamplingParams, StructuredOutput
from tests.integration.test_vllm_kv_subscriber import Recorder
from tests.support.vllm_wire_mirror import (
    MIRROR_RELEASES,
    MIRRORS,
    encode,
    struct_names,
    struct_options,
)
from tests.support.wait import wait_for
from tests.vllm_compat import sources
from workers.engine import EngineRequest
from workers.engines.vllm import kv_events
from workers.engines.vllm.backend import RealVllmBackend
from workers.engines.vllm.config import KvEventsEndpoints, VllmEngineConfig, engine_args_kwargs
from workers.engines.vllm.kv_events import BatchReader, DecodeOptions
from workers.engines.vllm.mapping import sampling_kwargs
from workers.engines.vllm.subscriber import KvEventSubscriber
from workers.engines.vllm.versions import KV_OFFLOADING, TESTED_RELEASES, features, parse_version

pytestmark = pytest.mark.vllm_compat

TOPIC = "kv-events"


# The facts of ``versions.py`` are checked on both sides of every boundary it names.
BOUNDARIES = (
    "0.10.0",
    "0.10.1",
    "0.11.2",
    "0.12.0",
    "0.23.0",
    "0.24.0",
    "0.25.1",
    "0.26.0",
    "0.28.0",
    "0.29.0",
    "0.33.0",
)


@pytest.fixture(scope="module", params=TESTED_RELEASES)
def vllm(request: pytest.FixtureRequest) -> Iterator[SimpleNamespace]:
    with sources.loaded(request.param) as modules:
        yield modules


@pytest.fixture(scope="module", params=BOUNDARIES)
def release(request: pytest.FixtureRequest) -> Iterator[SimpleNamespace]:
    with sources.loaded(request.param) as modules:
        yield modules


def make(cls: type[Any], **values: Any) -> Any:
    """One of the release's structs, with the given fields it has (the others left default)."""
    names = set(msgspec.structs.fields(cls) and (f.name for f in msgspec.structs.fields(cls)))
    return cls(**{k: v for k, v in values.items() if k in names})


def stored(ev: Any, hashes: list[Any], parent: Any, tokens: list[int], **extra: Any) -> Any:
    values = {"lora_id": None, "medium": "GPU", "lora_name": None} | extra
    return make(
        ev.BlockStored,
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=2,
        **values,
    )


def batch(ev: Any, events: list[Any], ts: float = 1.0) -> Any:
    return ev.KVEventBatch(ts=ts, events=events)


# ------------------------------------------------------------------------------ the structs
def test_events_encoded_by_vllm_decode_to_ours(vllm: SimpleNamespace) -> None:
    ev = vllm.kv_events
    tiers = "medium" in {f.name for f in msgspec.structs.fields(ev.BlockStored)}  # 0.10.2+
    h1: bytes | int
    h2: bytes | int
    if tiers:  # 0.10.2+: sha256 digests (bytes); before, ints
        h1, h2 = (b"\x00" * 24 + bytes([0, 0, 0, 0, 0, 0, 1, i]) for i in (1, 2))
    else:
        h1, h2 = 0x0101, 0x0102
    events = [
        stored(ev, [h1, h2], None, [1, 2, 3, 4]),
        stored(ev, [7], h2, [5, 6]),
        make(ev.BlockRemoved, block_hashes=[h2], medium="GPU"),
        ev.AllBlocksCleared(),
    ]
    if tiers:  # a block offloaded to host memory: indexed as the worker's host tier
        events.insert(3, stored(ev, [9], None, [9, 9], medium="CPU"))
    payload = msgspec.msgpack.Encoder().encode(batch(ev, events, ts=12.5))  # as the publisher
    decoded = BatchReader(ev.KVEventBatch).decode(payload)  # as its worker reads it
    assert decoded.ts_s == 12.5 and decoded.skipped == 0
    host = [BlockStored((9,), None, (9, 9), 2, medium="CPU")] if tiers else []
    assert decoded.events == (
        BlockStored((0x0101, 0x0102), None, (1, 2, 3, 4), 2),
        BlockStored((7,), 0x0102, (5, 6), 2),
        BlockRemoved((0x0102,)),
        *host,
        AllBlocksCleared(),
    )


def test_the_release_encodes_events_as_versions_py_says(release: SimpleNamespace) -> None:
    ev = release.kv_events
    raw = msgspec.msgpack.decode(
        msgspec.msgpack.Encoder().encode(batch(ev, [ev.AllBlocksCleared()]))
    )
    assert isinstance(raw, list)  # the batch: an array in every release
    assert isinstance(raw[1][0], dict) is features(release.release).events_as_maps


def test_lora_events_carry_what_the_decoder_reads(vllm: SimpleNamespace) -> None:
    ev = vllm.kv_events
    fields = {f.name for f in msgspec.structs.fields(ev.BlockStored)}
    event = make(ev.BlockStored, block_hashes=[3], parent_block_hash=None, token_ids=[1, 2],
                 block_size=2, lora_id=5, medium="GPU", lora_name="sql",
                 extra_keys=[("sql",)])  # fmt: skip
    payload = msgspec.msgpack.Encoder().encode(batch(ev, [event]))
    reader = BatchReader(ev.KVEventBatch, DecodeOptions(lora_names={5: "sql-by-id"}))
    by_id = reader.decode(payload).events
    expected = "sql" if "lora_name" in fields else "sql-by-id"  # lora_name from 0.14
    assert by_id == (BlockStored((3,), None, (1, 2), 2, lora_name=expected),)


# ---------------------------------------------------------------- the publisher and replay
@pytest.fixture
def publisher(vllm: SimpleNamespace) -> Iterator[tuple[Any, KvEventsEndpoints]]:
    directory = Path(tempfile.mkdtemp(prefix="jf-vllm-"))  # ipc paths must stay short
    endpoints = KvEventsEndpoints.in_directory(directory, TOPIC)
    pub = vllm.kv_events.ZmqEventPublisher(
        data_parallel_rank=0,
        endpoint=endpoints.bind_publish,
        replay_endpoint=endpoints.bind_replay,
        buffer_steps=1000,
        topic=TOPIC,
    )
    yield pub, endpoints
    pub.shutdown()
    shutil.rmtree(directory, ignore_errors=True)


async def buffered(pub: Any, n: int) -> None:
    """Wait until vLLM's publisher thread has sent (and kept for replay) ``n`` batches."""
    await wait_for(lambda: len(pub._buffer) >= n, timeout=10.0, interval=0.005)


async def test_a_gap_only_replay_can_fill_is_filled_without_a_loss(
    vllm: SimpleNamespace, publisher: tuple[Any, KvEventsEndpoints]
) -> None:
    """Batches sent before the subscription took hold are missing from the PUB stream; the
    first one that arrives reveals the gap, and vLLM's replay ROUTER must fill it. Before the
    replay fix, 0.26+ answered in a form the subscriber refused: every gap became a loss."""
    ev, (pub, endpoints) = vllm.kv_events, publisher
    for i in range(3):  # nobody subscribed yet: only the replay buffer keeps these
        pub.publish(batch(ev, [stored(ev, [100 + i], None if i == 0 else 99 + i, [i, i])]))
    await buffered(pub, 3)
    rec = Recorder(ev.KVEventBatch)
    sub = KvEventSubscriber(
        endpoints.connect_publish,
        endpoints.connect_replay,
        TOPIC,
        rec,
        replay_timeout_s=5.0,
    )
    await sub.start()
    try:
        n = 3
        deadline = time.monotonic() + 10.0
        while sub.stats.batches == 0:  # publish until one arrives through the PUB socket
            assert time.monotonic() < deadline, "no batch came through vLLM's PUB socket"
            pub.publish(batch(ev, [stored(ev, [100 + n], 99 + n, [n, n])]))
            n += 1
            await buffered(pub, n)
            await asyncio.sleep(0.01)
        await wait_for(lambda: sub.stats.batches == n, timeout=10.0, interval=0.005)
        hashes = [h for e in rec.events if isinstance(e, BlockStored) for h in e.block_hashes]
        assert hashes == list(range(100, 100 + n))  # every batch, in order
        assert rec.lost == [] and sub.stats.losses == 0
        assert sub.stats.gaps_filled >= 1 and sub.stats.replayed >= 3
    finally:
        await sub.close()


@pytest.mark.parametrize("vllm", BOUNDARIES, indirect=True)
async def test_replay_replies_have_the_form_versions_py_says(
    vllm: SimpleNamespace, publisher: tuple[Any, KvEventsEndpoints]
) -> None:
    ev, (pub, endpoints) = vllm.kv_events, publisher
    pub.publish(batch(ev, [ev.AllBlocksCleared()]))
    await buffered(pub, 1)
    ctx = zmq.asyncio.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoints.connect_replay or "")
    try:
        await dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        reply = await asyncio.wait_for(dealer.recv_multipart(), 10.0)
        end = await asyncio.wait_for(dealer.recv_multipart(), 10.0)
    finally:
        dealer.close(linger=0)
    with_topic = features(vllm.release).replay_with_topic
    assert len(reply) == (4 if with_topic else 3) and len(end) == len(reply)
    assert end[-2] == (-1).to_bytes(8, "big", signed=True)


# ------------------------------------------------------------------------ sampling params
@pytest.mark.parametrize(
    "ours",
    [
        SamplingParams(max_tokens=16),
        SamplingParams(
            max_tokens=8,
            temperature=0.7,
            top_p=0.9,
            top_k=40,
            min_p=0.05,
            presence_penalty=0.5,
            frequency_penalty=0.25,
            repetition_penalty=1.1,
            seed=7,
            ignore_eos=True,
            min_tokens=2,
            stop_token_ids=(2, 13),
        ),
    ],
)
def test_the_backend_builds_the_releases_sampling_params(
    vllm: SimpleNamespace, ours: SamplingParams
) -> None:
    req = EngineRequest("r", (1, 2, 3), ours, kv_transfer_params={"do_remote_decode": True})
    params = RealVllmBackend().sampling_params(sampling_kwargs(req))  # vLLM's own class
    assert type(params) is vllm.sampling_params.SamplingParams
    assert params.output_kind == vllm.sampling_params.RequestOutputKind.DELTA
    assert params.max_tokens == ours.max_tokens and params.seed == ours.seed
    assert params.temperature == ours.temperature and params.top_p == ours.top_p
    assert params.top_k == (ours.top_k or -1)  # -1: off, in every release
    assert params.min_p == ours.min_p and params.min_tokens == ours.min_tokens
    assert params.repetition_penalty == ours.repetition_penalty
    assert params.ignore_eos is ours.ignore_eos
    assert list(params.stop_token_ids) == list(ours.stop_token_ids)
    assert params.detokenize is False and params.n == 1
    assert params.extra_args == {"kv_transfer_params": {"do_remote_decode": True}}


@pytest.mark.parametrize("vllm", BOUNDARIES, indirect=True)
def test_constraints_and_logprobs_reach_the_releases_sampling_params(vllm: SimpleNamespace) -> None:
    """The constraint goes under the name the release reads (``structured_outputs`` from 0.11,
    ``guided_decoding`` before), as that release's own params class."""
    facts = features(vllm.release)
    fields = {f for f in vllm.sampling_params.SamplingParams.__struct_fields__}
    assert facts.structured_outputs == ("structured_outputs" in fields)
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    ours = SamplingParams(
        max_tokens=4, logprobs=3, prompt_logprobs=1, structured=StructuredOutput(json_schema=schema)
    )
    req = EngineRequest("r", (1, 2), ours)
    params = RealVllmBackend().sampling_params(sampling_kwargs(req, facts.structured_outputs))
    assert (params.logprobs, params.prompt_logprobs) == (3, 1)
    name, cls = (
        ("structured_outputs", "StructuredOutputsParams")
        if facts.structured_outputs
        else ("guided_decoding", "GuidedDecodingParams")
    )
    constraint = getattr(params, name)
    assert type(constraint) is getattr(vllm.sampling_params, cls)
    assert constraint.json == schema
    for st, field, value in (
        (StructuredOutput(choice=("a", "b")), "choice", ["a", "b"]),
        (StructuredOutput(regex="x+"), "regex", "x+"),
        (StructuredOutput(json_object=True), "json_object", True),
    ):
        req = EngineRequest("r", (1,), SamplingParams(max_tokens=2, structured=st))
        built = RealVllmBackend().sampling_params(sampling_kwargs(req, facts.structured_outputs))
        assert getattr(getattr(built, name), field) == value


def test_vllm_refuses_what_our_edge_validation_refuses(vllm: SimpleNamespace) -> None:
    """The frontend and the worker refuse these before vLLM; vLLM refusing them too means a
    request that slipped through ends as a clear error, not as undefined sampling."""
    refusals: tuple[type[Exception], ...] = (ValueError,)
    if hasattr(vllm.sampling_params, "VLLMValidationError"):  # not a ValueError in 0.33
        refusals += (vllm.sampling_params.VLLMValidationError,)
    for bad in ({"temperature": -1.0}, {"top_p": 0.0}, {"max_tokens": 0}):
        kwargs = sampling_kwargs(EngineRequest("r", (1,), SamplingParams(max_tokens=4))) | bad
        with pytest.raises(refusals, match=next(iter(bad))):
            RealVllmBackend().sampling_params(kwargs)


# ---------------------------------------------------- what is parsed, not imported
def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"class {name} not found")


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef)
    return {n.name: n for n in cls.body if isinstance(n, kinds)}


def _fields(cls: ast.ClassDef) -> set[str]:
    out = set()
    for n in cls.body:
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out.add(n.target.id)
    return out


def _text(release: str, name: str) -> ast.Module:
    text = sources.source_text(release, name)
    assert text is not None, f"{name} missing from vllm {release}"
    return ast.parse(text)


# AsyncLLM methods the adapter calls, with the parameters it passes by name.
ASYNC_LLM_CALLS = {
    "from_engine_args": {"stat_loggers", "usage_context"},
    "generate": {"prompt", "sampling_params", "request_id", "lora_request"},
    "encode": {"lora_request"},  # and (prompt, pooling_params, request_id) by position
    "abort": set(),
    "check_health": set(),
    "errored": set(),  # a property
    "is_sleeping": set(),
    "reset_prefix_cache": set(),
    "sleep": {"level"},
    "wake_up": {"tags"},
    "collective_rpc": {"method"},
    "add_lora": set(),
    "remove_lora": set(),
    "list_loras": set(),
    "shutdown": set(),
}


def test_async_llm_has_every_call_the_adapter_makes(vllm: SimpleNamespace) -> None:
    methods = _methods(_class(_text(vllm.release, "vllm/v1/engine/async_llm.py"), "AsyncLLM"))
    for name, params in ASYNC_LLM_CALLS.items():
        assert name in methods, f"AsyncLLM.{name} missing in vllm {vllm.release}"
        args = methods[name].args
        have = {a.arg for a in args.args + args.kwonlyargs}
        assert params <= have, f"AsyncLLM.{name} of vllm {vllm.release} lacks {params - have}"
    positional = [a.arg for a in methods["encode"].args.args[1:4]]
    assert positional == ["prompt", "pooling_params", "request_id"]


def test_pooling_params_take_what_the_backend_sets(vllm: SimpleNamespace) -> None:
    """``PoolingParams(task="embed", dimensions=...)``: both fields in every release."""
    tree = _text(vllm.release, "vllm/pooling_params.py")
    assert {"task", "dimensions"} <= _fields(_class(tree, "PoolingParams"))


def test_reset_and_sleep_behave_as_versions_py_says(release: SimpleNamespace) -> None:
    facts = features(release.release)
    llm = _methods(_class(_text(release.release, "vllm/v1/engine/async_llm.py"), "AsyncLLM"))
    returns = llm["reset_prefix_cache"].returns
    assert (returns is not None and ast.unparse(returns) == "bool") is facts.reset_returns_bool
    sleep_src = ast.unparse(llm["sleep"])
    core = sources.source_text(release.release, "vllm/v1/engine/core.py") or ""
    resets = "reset_prefix_cache" in sleep_src or "clear_prefix_cache = level >= 1" in core
    assert resets is facts.sleep_resets_cache
    assert ("get_num_unfinished_requests" in llm) is facts.counts_unfinished


def test_outputs_and_stats_have_the_fields_the_adapter_reads(vllm: SimpleNamespace) -> None:
    outputs = _text(vllm.release, "vllm/outputs.py")
    init = _methods(_class(outputs, "RequestOutput"))["__init__"]
    params = {a.arg for a in init.args.args + init.args.kwonlyargs}
    assert {"outputs", "finished", "num_cached_tokens", "kv_transfer_params"} <= params
    completion = _fields(_class(outputs, "CompletionOutput"))
    assert {"token_ids", "finish_reason"} <= completion
    stats = _text(vllm.release, "vllm/v1/metrics/stats.py")
    assert {"num_running_reqs", "num_waiting_reqs", "kv_cache_usage"} <= _fields(
        _class(stats, "SchedulerStats")
    )
    assert "self.num_preempted_reqs" in ast.unparse(_class(stats, "IterationStats"))


def test_engine_args_accept_what_the_config_builds(vllm: SimpleNamespace) -> None:
    args = _fields(_class(_text(vllm.release, "vllm/engine/arg_utils.py"), "EngineArgs"))
    cfg = VllmEngineConfig(
        model="m",
        max_model_len=4096,
        max_num_batched_tokens=8192,
        quantization="fp8",
        enable_lora=True,
        kv_connector="NixlConnector",
    )
    kwargs = engine_args_kwargs(cfg, KvEventsEndpoints("ipc:///x/p", "ipc:///x/r", TOPIC))
    assert set(kwargs) <= args, set(kwargs) - args
    # the host-memory tier's settings: from the release versions.py names
    tiered = engine_args_kwargs(
        replace(cfg, kv_offloading_size=8.0, kv_offloading_backend="native"), None
    )
    offloading = {"kv_offloading_size", "kv_offloading_backend"}
    assert offloading <= set(tiered)
    assert (offloading <= args) is (parse_version(vllm.release) >= KV_OFFLOADING)
    events_src = sources.source_text(vllm.release, "vllm/config/kv_events.py") or (
        sources.source_text(vllm.release, "vllm/config.py") or ""
    )
    events_cfg = _fields(_class(ast.parse(events_src), "KVEventsConfig"))
    assert set(kwargs["kv_events_config"]) <= events_cfg


# ----------------------------------------------- the unit tests' mirrors of vLLM's structs
@pytest.mark.parametrize(("generation", "vllm"), list(MIRROR_RELEASES.items()), indirect=["vllm"])
def test_each_mirror_is_the_release_it_names(generation: str, vllm: SimpleNamespace) -> None:
    real, mirror = vllm.kv_events, MIRRORS[generation]
    for name, cls in mirror.items():
        theirs = getattr(real, name)
        assert struct_names(theirs) == struct_names(cls), (generation, name)
        assert struct_options(theirs) == struct_options(cls), (generation, name)
    sample = {
        "block_hashes": [11, b"\x01" * 32],
        "parent_block_hash": 10,
        "token_ids": [1, 2, 3, 4],
    }
    fields = struct_names(mirror["BlockStored"])
    stored = {n: sample.get(n, 2 if n == "block_size" else None) for n in fields}
    removed = {
        n: ([11] if n == "block_hashes" else None) for n in struct_names(mirror["BlockRemoved"])
    }
    ours = mirror["KVEventBatch"](
        ts=1.5, events=[mirror["BlockStored"](**stored), mirror["BlockRemoved"](**removed)]
    )
    theirs_batch = real.KVEventBatch(
        ts=1.5, events=[real.BlockStored(**stored), real.BlockRemoved(**removed)]
    )
    assert encode(theirs_batch) == encode(ours)


def test_the_release_has_what_the_translation_reads(release: SimpleNamespace) -> None:
    """``kv_events.translate`` reads the events' fields by name and their type by tag."""
    real = release.kv_events
    assert {"block_hashes", "parent_block_hash", "token_ids", "block_size"} <= set(
        struct_names(real.BlockStored)
    )
    assert "block_hashes" in struct_names(real.BlockRemoved)
    assert {"ts", "events"} <= set(struct_names(real.KVEventBatch))
    assert kv_events.event_type(real.AllBlocksCleared()) == "AllBlocksCleared"
