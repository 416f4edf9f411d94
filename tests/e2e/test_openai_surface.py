"""Logprobs, echo, structured output, tools and reasoning with the official openai client, against
a real fleet of mocker workers on the shipped card (hermes tool calls, see its jetfleet.json)."""

from __future__ import annotations

import base64
import json
import math
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from tokenizers import Tokenizer

from model.card import default_model_dir
from tests.support.clients import openai_client
from tests.support.fleet import Fleet
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

MODEL = "jetfleet-tiny"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 2},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "top": {"type": "integer"}},
                "required": ["query"],
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def reasoning_fleet(nats_server, tmp_path_factory) -> Iterator[Fleet]:
    """One worker of a copy of the card without its jetfleet.json (no tool call parser), served
    as another model whose output is parsed for reasoning."""
    model = tmp_path_factory.mktemp("thinker")
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(default_model_dir() / name, model / name)
    # and a copy whose tokenizer has Mistral's [TOOL_CALLS] as a special token (the worker
    # skips special tokens unless the frontend asks it to keep the parser's markers)
    mistral = tmp_path_factory.mktemp("mistral")
    for name in ("tokenizer_config.json", "config.json"):
        shutil.copy(default_model_dir() / name, mistral / name)
    tok = Tokenizer.from_file(str(default_model_dir() / "tokenizer.json"))
    tok.add_special_tokens(["[TOOL_CALLS]"])
    tok.save(str(mistral / "tokenizer.json"))
    f = Fleet(nats_server.url, tmp_path_factory.mktemp("reasoning-logs"))
    try:
        f.add_worker(
            "--model", str(model), "--served-model-name", "thinker", "--reasoning-parser", "qwen3"
        )
        f.add_worker(
            "--model",
            str(mistral),
            "--served-model-name",
            "mistral",
            "--tool-call-parser",
            "mistral",
        )
        url = f.start_frontend("--router", "round-robin")
        # /ready needs only one of them
        wait_until(lambda: _served(url) == {"thinker", "mistral"}, 30, "both models served")
        yield f
    finally:
        f.stop()


def _served(url: str) -> set[str]:
    with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as r:
        return {m["id"] for m in json.load(r)["data"]}


def _chat(client: openai.OpenAI, stream: bool, **kwargs: Any) -> dict[str, Any]:
    """One answer as {content, reasoning, tool_calls, finish_reason, logprobs}, streamed or not."""
    base: dict[str, Any] = {"model": MODEL, "max_tokens": 200, "seed": 4}
    base["messages"] = [{"role": "user", "content": "What is the weather in Paris?"}]
    args = base | kwargs
    if not stream:
        r = client.chat.completions.create(**args)
        c = r.choices[0]
        calls = [(t.function.name, t.function.arguments) for t in c.message.tool_calls or ()]
        lps = c.logprobs.content if c.logprobs else None
        return {
            "content": c.message.content or "",
            "reasoning": getattr(c.message, "reasoning_content", None) or "",
            "tool_calls": calls,
            "finish_reason": c.finish_reason,
            "logprobs": [(e.token, e.logprob) for e in lps] if lps is not None else None,
        }
    out: dict[str, Any] = {"content": "", "reasoning": "", "tool_calls": [], "logprobs": None}
    for chunk in client.chat.completions.create(**args, stream=True):
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        out["content"] += c.delta.content or ""
        out["reasoning"] += getattr(c.delta, "reasoning_content", None) or ""
        for t in c.delta.tool_calls or ():
            assert t.id and t.type == "function"  # each call arrives whole, with its id
            out["tool_calls"].append((t.function.name, t.function.arguments))
        if c.logprobs is not None and c.logprobs.content is not None:
            out["logprobs"] = (out["logprobs"] or []) + [
                (e.token, e.logprob) for e in c.logprobs.content
            ]
        if c.finish_reason:
            out["finish_reason"] = c.finish_reason
    return out


# ---------------------------------------------------------------------------------- logprobs
def test_chat_logprobs_have_openais_shape_and_agree_streamed_or_not(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=12,
        seed=9,
        logprobs=True,
        top_logprobs=3,
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 12 == r.usage.completion_tokens
    assert "".join(e.token for e in content) == r.choices[0].message.content
    for e in content:
        assert math.log(0.4) - 1e-9 <= e.logprob <= 0 and e.bytes == list(e.token.encode())
        assert len(e.top_logprobs) == 3
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob
        values = [t.logprob for t in e.top_logprobs]
        assert (
            values == sorted(values, reverse=True) and len({t.token for t in e.top_logprobs}) == 3
        )
    streamed = _chat(
        client,
        True,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=12,
        seed=9,
        logprobs=True,
        top_logprobs=3,
    )
    assert streamed["logprobs"] == [(e.token, e.logprob) for e in content]
    plain = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3, seed=9
    )
    assert plain.choices[0].logprobs is None


def test_completion_logprobs_and_echo(client):
    r = client.completions.create(model=MODEL, prompt="Once", max_tokens=5, seed=2, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(5)]
    assert all(
        len(top) == 2 and max(top.values()) == v
        for top, v in zip(lp.top_logprobs, lp.token_logprobs, strict=True)
    )

    echoed = client.completions.create(
        model=MODEL, prompt="Once", max_tokens=5, seed=2, logprobs=1, echo=True
    )
    text, elp = echoed.choices[0].text, echoed.choices[0].logprobs
    assert text == "Once" + r.choices[0].text
    assert elp.tokens[:4] == ["O", "n", "c", "e"] and elp.token_logprobs[0] is None
    assert elp.top_logprobs[0] is None and all(v is not None for v in elp.token_logprobs[1:])
    assert elp.tokens[4:] == lp.tokens and elp.token_logprobs[4:] == lp.token_logprobs
    assert elp.text_offset == list(range(9))

    streamed = [
        c.choices[0]
        for c in client.completions.create(
            model=MODEL, prompt="Once", max_tokens=5, seed=2, logprobs=1, echo=True, stream=True
        )
        if c.choices
    ]
    assert "".join(c.text for c in streamed) == text
    assert [t for c in streamed if c.logprobs for t in c.logprobs.tokens] == elp.tokens


# ---------------------------------------------------------------------- structured output
@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_answers_validate(client, stream):
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "kind": {"anyOf": [{"type": "null"}, {"enum": ["a", "b"]}]},
        },
        "required": ["name", "tags", "score"],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "item", "schema": schema}}
    for seed in range(5):
        out = _chat(client, stream, response_format=fmt, seed=seed)
        jsonschema.validate(json.loads(out["content"]), schema)
        assert out["finish_reason"] == "stop"


def test_json_object_and_vllm_extras(client):
    out = _chat(client, False, response_format={"type": "json_object"})
    assert isinstance(json.loads(out["content"]), dict)
    choice = _chat(client, False, extra_body={"guided_choice": ["yes", "no"]})
    assert choice["content"] in ("yes", "no") and choice["finish_reason"] == "stop"
    r = client.completions.create(
        model=MODEL, prompt="x", max_tokens=50, extra_body={"guided_json": {"type": "integer"}}
    )
    assert isinstance(json.loads(r.choices[0].text), int)


def test_a_constraint_the_mocker_cannot_honour_is_a_400_naming_it(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"guided_regex": "[a-z]+@[a-z]+"},
        )
    assert "mocker" in str(err.value) and "regex" in str(err.value)
    with pytest.raises(openai.BadRequestError, match="pattern"):
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "p", "schema": {"type": "string", "pattern": "^a+$"}},
            },
        )


# ------------------------------------------------------------------------------------ tools
@pytest.mark.parametrize("stream", [False, True])
def test_named_tool_choice_always_calls_it_with_valid_arguments(client, stream):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    for seed in range(4):
        out = _chat(client, stream, tools=TOOLS, tool_choice=choice, seed=seed)
        assert out["finish_reason"] == "tool_calls" and out["content"] == ""
        [(name, arguments)] = out["tool_calls"]
        assert name == "get_weather"
        jsonschema.validate(json.loads(arguments), WEATHER)


@pytest.mark.parametrize("stream", [False, True])
def test_required_tool_choice_calls_some_tool_validly(client, stream):
    names = set()
    for seed in range(8):
        out = _chat(
            client,
            stream,
            tools=TOOLS,
            tool_choice="required",
            seed=seed,
            parallel_tool_calls=False,
        )
        [(name, arguments)] = out["tool_calls"]
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])
        names.add(name)
    assert names == {"get_weather", "search"}  # the seed picks among the tools


def test_streamed_and_whole_answers_are_the_same(client):
    for kwargs in (
        {"tools": TOOLS, "tool_choice": "required"},
        {"tools": TOOLS},  # auto: the mocker's text has no call, so it is all content
        {"response_format": {"type": "json_object"}},
    ):
        whole, streamed = _chat(client, False, **kwargs), _chat(client, True, **kwargs)
        for key in ("content", "tool_calls", "finish_reason"):
            assert whole[key] == streamed[key], key


def test_a_coding_agent_turn_runs_through_chat_completions(client):
    """System prompt, tools, a call, the tool's result, a final streamed answer."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Find the failing test."},
    ]
    first = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="required", max_tokens=300
    )
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls"
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "tests/test_x.py::t"})
    final = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=MODEL, messages=messages, tools=TOOLS, max_tokens=16, stream=True
        )
        if c.choices
    )
    assert len(final) > 0


def test_auto_tools_without_a_parser_and_bad_tools_are_400s(fleet, reasoning_fleet):
    thinker = openai_client(reasoning_fleet.base_url)
    with pytest.raises(openai.BadRequestError, match="tool call parser"):
        thinker.chat.completions.create(
            model="thinker", messages=[{"role": "user", "content": "x"}], tools=TOOLS
        )
    client = openai_client(fleet.base_url)
    with pytest.raises(openai.BadRequestError, match="not in tools"):
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )


# -------------------------------------------------------------------------------- reasoning
@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_moves_into_reasoning_content(reasoning_fleet, stream):
    client = openai_client(reasoning_fleet.base_url)
    # guided_choice makes the mocker write exactly this text: the parser is what is tested
    text = "<think>The user greets me.\nBe brief.</think>Hello!"
    out = _chat(client, stream, model="thinker", extra_body={"guided_choice": [text]})
    assert out["reasoning"] == "The user greets me.\nBe brief."
    assert out["content"] == "Hello!"
    plain = _chat(client, stream, model="thinker", extra_body={"guided_choice": ["No think."]})
    assert (plain["reasoning"], plain["content"]) == ("", "No think.")


@pytest.mark.parametrize("stream", [False, True])
def test_auto_tool_calls_with_a_special_token_marker_are_parsed(reasoning_fleet, stream):
    """Mistral's [TOOL_CALLS] is a special token: the frontend asks the worker to keep special
    tokens for this request, and the mistral parser finds the call in the text."""
    client = openai_client(reasoning_fleet.base_url)
    text = 'Searching.[TOOL_CALLS][{"name": "search", "arguments": {"query": "jetfleet"}}]'
    out = _chat(client, stream, model="mistral", tools=TOOLS, extra_body={"guided_choice": [text]})
    assert out["content"] == "Searching."
    assert out["tool_calls"] == [("search", '{"query": "jetfleet"}')]
    assert out["finish_reason"] == "tool_calls"
    plain = _chat(client, stream, model="mistral", extra_body={"guided_choice": [text]})
    assert "[TOOL_CALLS]" not in plain["content"]  # without tools, special tokens are skipped


def test_prompt_embeds_to_a_model_whose_workers_cannot_take_them_is_a_400(client):
    raw = (Path(__file__).resolve().parents[1] / "data" / "prompt_embeds_f32_3x64.pt").read_bytes()
    with pytest.raises(openai.BadRequestError, match="enable_prompt_embeds"):
        client.completions.create(
            model=MODEL,
            prompt=None,
            max_tokens=4,
            extra_body={"prompt_embeds": base64.b64encode(raw).decode()},
        )
