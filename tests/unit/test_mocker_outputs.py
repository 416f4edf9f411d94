"""What the mocker emits besides plain tokens: structured output (a deterministic instance of the
constraint, validated with ``jsonschema``) and synthetic logprobs (the documented distribution)."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import replace
from typing import Any

import jsonschema
import msgspec
import pytest

from model.structured import Unsatisfiable, instance, problem, render
from schemas import SamplingParams, StructuredOutput
from tests.support.engines import Sink
from tests.support.wait import wait_for
from tests.unit.mocker_utils import (
    add_and_run,
    expected_tokens,
    make_config,
    make_request,
    make_scheduler,
)
from workers.engine import EngineHooks, EngineOutput, EngineRequest
from workers.engines.mocker.embedding import embedding
from workers.engines.mocker.engine import MockerEngine, vocabulary_token_source
from workers.engines.mocker.logprobs import chosen_probability, prompt_logprobs, token_logprob

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object"},
    {"type": "integer", "minimum": 5, "exclusiveMaximum": 7},
    {"type": "number", "minimum": -1.5, "maximum": -1.25},
    {"type": "integer", "multipleOf": 7, "minimum": 20, "maximum": 30},
    {"type": "string", "minLength": 30, "maxLength": 32},
    {"type": "string", "format": "date-time"},
    {"type": ["null", "boolean"]},
    {"enum": ["red", 3, None]},
    {"const": {"a": [1]}},
    {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 3},
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}]},
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 3},
            "address": {"$ref": "#/$defs/address"},
            "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 1},
            "choice": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
            "any": {"anyOf": [{"type": "null"}, {"type": "number", "minimum": 0}]},
        },
        "required": ["name", "address"],
        "additionalProperties": False,
        "$defs": {
            "address": {
                "type": "object",
                "properties": {"street": {"type": "string"}, "zip": {"type": "integer"}},
                "required": ["zip"],
            }
        },
    },
    {"allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"required": ["b"]}]},
    {  # recursive: a tree of nodes ends because deep nodes keep only required fields
        "$ref": "#/definitions/node",
        "definitions": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "integer"},
                    "kids": {"type": "array", "items": {"$ref": "#/definitions/node"}},
                },
                "required": ["v"],
            }
        },
    },
    {"type": "object", "minProperties": 2, "additionalProperties": {"type": "integer"}},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=[json.dumps(s)[:40] for s in SCHEMAS])
def test_every_instance_validates_and_the_seed_decides_it(schema: dict[str, Any]) -> None:
    values = []
    for seed in range(25):
        value = instance(schema, seed)
        jsonschema.validate(value, schema)
        assert instance(schema, seed) == value  # deterministic
        values.append(json.dumps(value, sort_keys=True))
    if not schema.get("const") and schema.get("type") not in ("object",):
        assert len(set(values)) > 1 or "maxLength" in schema or "format" in schema


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "string", "pattern": "^a$"}, "pattern"),
        ({"not": {"type": "string"}}, "not"),
        ({"$ref": "https://example.com/s.json"}, "only local"),
        ({"type": "integer", "minimum": 3, "maximum": 2}, "no number"),
        ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength"),
        ({"type": "object", "properties": {"p": {"if": {}}}}, "if"),
        ({"enum": []}, "enum"),
        ({"type": "object", "minProperties": 1, "additionalProperties": False}, "minProperties"),
    ],
)
def test_what_cannot_be_satisfied_for_sure_is_refused_by_name(schema: Any, keyword: str) -> None:
    structured = StructuredOutput(json_schema=json.dumps(schema))
    with pytest.raises(Unsatisfiable, match=keyword):
        render(structured, 0)
    assert keyword in (problem(structured) or "")


def test_other_constraints() -> None:
    assert json.loads(render(StructuredOutput(json_object=True), 3)).keys() == {"result"}
    picks = {render(StructuredOutput(choice=("a", "b", "c")), s) for s in range(30)}
    assert picks == {"a", "b", "c"}
    for kind in (StructuredOutput(regex="a+"), StructuredOutput(grammar="root ::= 'a'")):
        assert "cannot be honoured" in (problem(kind) or "")


# ----------------------------------------------------------------------- forced tokens
def test_a_forced_sequence_emits_its_tokens_then_stops() -> None:
    sched = make_scheduler()
    forced = (5, 6, 7)
    req = replace(make_request("f", 9, max_tokens=10), forced=forced)
    cut = replace(make_request("c", 9, max_tokens=2), forced=forced)
    run = add_and_run(sched, req, cut)
    assert (run.tokens["f"], run.finish["f"]) == ([5, 6, 7], "stop")
    assert (run.tokens["c"], run.finish["c"]) == ([5, 6], "length")  # max_tokens still binds
    assert sched.stats().kv_usage == 0.0  # a stopped sequence frees its blocks


def test_a_migrated_forced_sequence_continues_where_the_first_attempt_stopped() -> None:
    sched = make_scheduler()
    req = replace(make_request("m", (1, 2, 3, 5, 6), max_tokens=8), forced=(5, 6, 7, 8))
    run = add_and_run(sched, replace(req, first_position=2))
    assert (run.tokens["m"], run.finish["m"]) == ([7, 8], "stop")


# ---------------------------------------------------------------------------- stop tokens
def test_a_stop_token_ends_the_sequence_with_itself_once_min_tokens_are_out() -> None:
    sched = make_scheduler()
    req = make_request("s", 9, max_tokens=24, seed=3)
    plain = expected_tokens(req)  # without stop tokens: 24 tokens, "length"
    token = next(t for t in plain if plain.count(t) >= 2)  # one that comes back later
    first, again = [i for i, t in enumerate(plain) if t == token][:2]
    once = next(i for i, t in enumerate(plain) if plain.count(t) == 1)
    cases = {  # (stop tokens, min_tokens) -> (tokens, finish)
        "first": ({token, 1}, 0, plain[: first + 1], "stop"),
        "min_tokens": ({token}, again + 1, plain[: again + 1], "stop"),  # just enough
        "never": ({plain[once]}, once + 2, plain, "length"),
    }
    for rid, (stops, min_tokens, tokens, finish) in cases.items():
        run = add_and_run(
            sched,
            replace(req, request_id=rid, stop_token_ids=frozenset(stops), min_tokens=min_tokens),
        )
        assert (run.tokens[rid], run.finish[rid]) == (tokens, finish), rid
    assert sched.stats().kv_usage == 0.0  # a stopped sequence frees its blocks


# ------------------------------------------------------------------------------ logprobs
VOCAB = tuple(range(40, 140))
SOURCE = vocabulary_token_source(VOCAB)


def test_logprobs_follow_the_documented_distribution() -> None:
    for position in range(200):
        token = SOURCE(11, position)
        lp = token_logprob(SOURCE, 11, position, token, 5)
        p = chosen_probability(11, position)
        assert 0.40 <= p < 0.99 and lp.logprob == pytest.approx(math.log(p))
        assert lp.top_ids[0] == token and lp.top_logprobs[0] == lp.logprob
        assert len(set(lp.top_ids)) == len(lp.top_ids) == 5
        expected = [math.log(p)] + [math.log((1 - p) / 2**j) for j in range(1, 5)]
        assert list(lp.top_logprobs) == pytest.approx(expected)
        assert sum(math.exp(v) for v in lp.top_logprobs) < 1
        assert token_logprob(SOURCE, 11, position, token, 0).top_ids == ()
    assert token_logprob(SOURCE, 11, 3, 50, 2) == token_logprob(SOURCE, 11, 3, 50, 2)


def test_prompt_logprobs_start_with_none() -> None:
    lps = prompt_logprobs(SOURCE, (60, 61, 62), 1)
    assert lps[0] is None and len(lps) == 3
    assert all(
        lp is not None and lp.top_ids == (tok,) for lp, tok in zip(lps[1:], (61, 62), strict=True)
    )


async def _generate(engine: MockerEngine, request: EngineRequest) -> list[EngineOutput]:
    sink = Sink()
    engine.add_request(request, sink)
    await asyncio.wait_for(sink.done.wait(), 10)
    return sink.outputs


async def test_the_engine_sends_logprobs_for_every_token_and_the_prompt_once() -> None:
    engine = MockerEngine(make_config(speedup=1000.0), VOCAB, lambda text: [ord(c) for c in text])
    await engine.start(EngineHooks(lambda events: None))
    try:
        sp = SamplingParams(max_tokens=6, seed=5, logprobs=2, prompt_logprobs=1)
        outs = await _generate(engine, EngineRequest("r", (1, 2, 3, 4), sp))
        tokens = [t for o in outs for t in o.new_token_ids]
        lps = [lp for o in outs for lp in o.logprobs or ()]
        assert len(lps) == len(tokens) == 6
        assert [lp.top_ids[0] for lp in lps] == tokens
        assert [o.prompt_logprobs is not None for o in outs] == [True] + [False] * (len(outs) - 1)
        # a migration (attempt 2 carries 3 generated tokens) continues the same logprobs
        again = await _generate(
            engine,
            EngineRequest(
                "r",
                (1, 2, 3, 4, *tokens[:3]),
                msgspec.structs.replace(sp, max_tokens=3),
                num_generated_before=3,
            ),
        )
        assert [lp for o in again for lp in o.logprobs or ()] == lps[3:]

        structured = msgspec.structs.replace(
            sp, logprobs=None, prompt_logprobs=None, structured=StructuredOutput(choice=("yes!",))
        )
        outs = await _generate(
            engine, EngineRequest("s", (1, 2), msgspec.structs.replace(structured, max_tokens=50))
        )
        assert "".join(chr(t) for o in outs for t in o.new_token_ids) == "yes!"
        assert outs[-1].finish_reason == "stop" and all(o.logprobs is None for o in outs)

        bad = msgspec.structs.replace(sp, structured=StructuredOutput(regex="a+"))
        [failed] = await _generate(engine, EngineRequest("b", (1,), bad))
        assert failed.finish_reason == "error" and "regex" in (failed.error or "")
    finally:
        await engine.stop()


# ---------------------------------------------------------------------------- embeddings
def test_an_embed_sequence_computes_its_prompt_and_emits_no_token() -> None:
    sched = make_scheduler()
    req = replace(make_request("e", 9, max_tokens=1), embed=True)
    run = add_and_run(sched, req)
    assert (run.tokens["e"], run.finish["e"]) == ([], "stop")
    assert sum(len(s.outputs) for s in run.steps) == 1
    assert run.steps[0].num_prefill_tokens == 9
    again = add_and_run(sched, replace(req, request_id="e2"))
    assert again.cached["e2"] == 8  # its full blocks stayed in the prefix cache


def test_embedding_vectors() -> None:
    v = embedding((1, 2, 3), 32)
    assert len(v) == 32 and sum(x * x for x in v) == pytest.approx(1.0)
    assert embedding((1, 2, 3), 32) == v != embedding((1, 2, 4), 32)
    short = embedding((1, 2, 3), 32, 4)
    assert len(short) == 4 and sum(x * x for x in short) == pytest.approx(1.0)
    assert [x / short[0] for x in short] == pytest.approx([x / v[0] for x in v[:4]])
    with pytest.raises(ValueError, match="dimensions"):
        embedding((1,), 32, 33)


async def test_the_engine_answers_embeddings() -> None:
    engine = MockerEngine(make_config(speedup=1000.0), VOCAB, hidden_size=16)
    await engine.start(EngineHooks(lambda events: None))
    try:
        sp = SamplingParams(max_tokens=1)
        [out] = await _generate(engine, EngineRequest("e", (5, 6, 7), sp, task="embed"))
        assert out.finish_reason == "stop" and out.new_token_ids == ()
        assert out.embedding == embedding((5, 6, 7), 16)
        [short] = await _generate(engine, EngineRequest("s", (5,), sp, task="embed", dimensions=4))
        assert short.embedding is not None and len(short.embedding) == 4
        [bad] = await _generate(engine, EngineRequest("b", (5,), sp, task="embed", dimensions=17))
        assert bad.finish_reason == "error" and "at most 16" in (bad.error or "")
    finally:
        await engine.stop()


async def test_the_load_counts_the_prefill_of_the_step_in_its_forward_pass() -> None:
    """The scheduler moves a sequence's counters when it plans the step; until the pass ends
    (the engine's sleep), those prompt tokens are still prefill to do, as in vLLM."""
    engine = MockerEngine(make_config(speedup=0.05), VOCAB)
    await engine.start(EngineHooks(lambda events: None))
    try:
        sink = Sink()
        request = EngineRequest("p", tuple(range(1, 41)), SamplingParams(max_tokens=2))
        engine.add_request(request, sink)
        # the loop plans the step (the sequence runs) and sleeps through its forward pass
        await wait_for(lambda: engine.load().num_running == 1, timeout=10)
        assert engine.load().active_prefill_tokens == 40
        await asyncio.wait_for(sink.done.wait(), 10)
        assert engine.load().active_prefill_tokens == 0
        assert engine.load().steps_total == 2  # a prefill step and a decode step
    finally:
        await engine.stop()
