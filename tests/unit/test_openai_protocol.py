"""OpenAI request parsing and validation: good and bad bodies, errors with status and param."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from router.frontend.errors import OpenAIError
from router.frontend.openai_protocol import parse_chat_request, parse_completion_request
from router.frontend.params import (
    GenerationParams,
    chat_generation_params,
    completion_generation_params,
    parse_chat,
    parse_completion,
    resolve_max_tokens,
)
from router.frontend.tools import ToolPlan
from schemas import SamplingParams, StructuredOutput

MSG = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> bytes:
    return json.dumps({"model": "m", "messages": MSG} | fields).encode()


def completion(**fields: Any) -> bytes:
    return json.dumps({"model": "m", "prompt": "hi"} | fields).encode()


def error_of(parse: Any, body: bytes) -> OpenAIError:
    with pytest.raises(OpenAIError) as info:
        parse(body)
    return info.value


def _tool(name: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name}
    if params is not None:
        fn["parameters"] = params
    return {"type": "function", "function": fn}


def _named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


GOOD_CHAT = [
    chat(),
    chat(max_tokens=5, temperature=0, top_p=1, seed=7, n=16, stop="x"),
    chat(stop=["a", "b", "c", "d"], stream=True, stream_options={"include_usage": True}),
    chat(ignore_eos=True, min_tokens=0, presence_penalty=-2, frequency_penalty=2, user="u"),
    chat(logprobs=False, top_logprobs=0, tools=[], logit_bias={}, tool_choice="none"),
    chat(logprobs=True, top_logprobs=5, tools=[_tool("f", {"type": "object"})], tool_choice="auto"),
    chat(tools=[_tool("f")], tool_choice=_named("f"), parallel_tool_calls=False),
    chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}),
    chat(guided_json={"type": "object"}, chat_template_kwargs={"enable_thinking": False}),
    chat(structured_outputs={"choice": ["a", "b"]}),
    chat(reasoning_effort="low", modalities=["text"]),
    chat(response_format={"type": "text"}, best_of=1, unknown_field={"ignored": 1}),
    chat(temperature=None, n=None, stream=None, stop=None, stream_options=None, seed=None),
    chat(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}]}]),
    chat(messages=[{"role": r, "content": "x"} for r in ("system", "developer", "user")]),
    chat(messages=[*MSG, {"role": "assistant", "content": None}, {"role": "tool", "content": ""}]),
]

BAD_CHAT: list[tuple[str, bytes, int, str | None]] = [
    ("empty body", b"", 400, None),
    ("malformed json", b'{"model": "m",', 400, None),
    ("not utf-8", b"\xff\xfe", 400, None),
    ("array body", b"[1, 2]", 400, None),
    ("string body", b'"hello"', 400, None),
    ("null body", b"null", 400, None),
    ("missing model", json.dumps({"messages": MSG}).encode(), 400, "model"),
    ("empty model", chat(model=""), 400, "model"),
    ("missing messages", json.dumps({"model": "m"}).encode(), 400, "messages"),
    ("empty messages", chat(messages=[]), 400, "messages"),
    ("bad role", chat(messages=[{"role": "bot", "content": "x"}]), 400, "messages[0].role"),
    ("missing role", chat(messages=[{"content": "x"}]), 400, "messages[0].role"),
    ("user content null", chat(messages=[{"role": "user"}]), 400, "messages[0].content"),
    (
        "image part",
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        400,
        "messages[0].content[0].type",
    ),
    (
        "part text not str",
        chat(messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}]),
        400,
        "messages[0].content[0].text",
    ),
    ("content number", chat(messages=[{"role": "user", "content": 3}]), 400, "messages[0].content"),
    ("temperature type", chat(temperature="hot"), 400, "temperature"),
    ("temperature high", chat(temperature=2.5), 400, "temperature"),
    ("temperature negative", chat(temperature=-0.1), 400, "temperature"),
    ("top_p zero", chat(top_p=0), 400, "top_p"),
    ("top_p high", chat(top_p=1.01), 400, "top_p"),
    ("n zero", chat(n=0), 400, "n"),
    ("n high", chat(n=17), 400, "n"),
    ("n bool", chat(n=True), 400, "n"),
    ("n float", chat(n=1.5), 400, "n"),
    ("max_tokens zero", chat(max_tokens=0), 400, "max_tokens"),
    ("max_tokens string", chat(max_tokens="5"), 400, "max_tokens"),
    ("max_completion_tokens zero", chat(max_completion_tokens=0), 400, "max_completion_tokens"),
    ("too many stops", chat(stop=["a", "b", "c", "d", "e"]), 400, "stop"),
    ("empty stop", chat(stop=""), 400, "stop"),
    ("empty stop in list", chat(stop=["a", ""]), 400, "stop"),
    ("stop not str", chat(stop=[1]), 400, "stop[0]"),
    ("seed float", chat(seed=1.5), 400, "seed"),
    ("seed too large", chat(seed=2**64), 400, "seed"),
    ("stream not bool", chat(stream="yes"), 400, "stream"),
    (
        "stream_options no stream",
        chat(stream_options={"include_usage": True}),
        400,
        "stream_options",
    ),
    (
        "include_usage type",
        chat(stream=True, stream_options={"include_usage": 1}),
        400,
        "stream_options.include_usage",
    ),
    ("min_tokens negative", chat(min_tokens=-1), 400, "min_tokens"),
    ("presence_penalty", chat(presence_penalty=3), 400, "presence_penalty"),
    ("frequency_penalty", chat(frequency_penalty=-2.5), 400, "frequency_penalty"),
    ("top_k below off", chat(top_k=-2), 400, "top_k"),
    ("top_k type", chat(top_k=1.5), 400, "top_k"),
    ("min_p", chat(min_p=1.5), 400, "min_p"),
    ("repetition_penalty zero", chat(repetition_penalty=0), 400, "repetition_penalty"),
    ("top_logprobs without logprobs", chat(top_logprobs=2), 400, "top_logprobs"),
    ("top_logprobs above 20", chat(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    (
        "tool without a name",
        chat(tools=[{"type": "function", "function": {}}]),
        400,
        "tools[0].function.name",
    ),
    ("tool not a function", chat(tools=[{"type": "code_interpreter"}]), 400, "tools[0].type"),
    ("tool names repeat", chat(tools=[_tool("f"), _tool("f")]), 400, "tools"),
    ("tool_choice without tools", chat(tool_choice="required"), 400, "tool_choice"),
    ("tool_choice unknown", chat(tools=[_tool("f")], tool_choice="maybe"), 400, "tool_choice"),
    (
        "tool_choice names no tool",
        chat(tools=[_tool("f")], tool_choice=_named("g")),
        400,
        "tool_choice",
    ),
    ("response_format type", chat(response_format={"type": "yaml"}), 400, "response_format.type"),
    (
        "json_schema without schema",
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
        400,
        "response_format.json_schema.schema",
    ),
    (
        "two constraints",
        chat(response_format={"type": "json_object"}, guided_regex="a+"),
        400,
        "guided_regex",
    ),
    ("guided_json not JSON", chat(guided_json="{nope"), 400, "guided_json"),
    ("guided_choice empty", chat(guided_choice=[]), 400, "guided_choice"),
    (
        "structured_outputs two keys",
        chat(structured_outputs={"regex": "a", "choice": ["b"]}),
        400,
        "structured_outputs",
    ),
    (
        "constraint with tool_choice required",
        chat(tools=[_tool("f")], tool_choice="required", response_format={"type": "json_object"}),
        400,
        "response_format",
    ),
    ("logit_bias", chat(logit_bias={"1": 5}), 400, "logit_bias"),
    ("best_of", chat(best_of=2), 400, "best_of"),
    ("user type", chat(user=5), 400, "user"),
    ("reasoning_effort", chat(reasoning_effort="extreme"), 400, "reasoning_effort"),
    ("audio output", chat(modalities=["text", "audio"]), 400, "modalities"),
    ("audio", chat(audio={"voice": "alloy", "format": "wav"}), 400, "audio"),
    ("prediction", chat(prediction={"type": "content", "content": "x"}), 400, "prediction"),
    ("web search", chat(web_search_options={}), 400, "web_search_options"),
]

BAD_COMPLETION: list[tuple[str, bytes, int, str | None]] = [
    ("missing prompt", json.dumps({"model": "m"}).encode(), 400, "prompt"),
    ("empty prompt", completion(prompt=""), 400, "prompt"),
    ("empty ids", completion(prompt=[]), 400, "prompt"),
    ("batch of strings", completion(prompt=["a", "b"]), 400, "prompt"),
    ("batch of ids", completion(prompt=[[1], [2]]), 400, "prompt"),
    ("mixed list", completion(prompt=[1, "a"]), 400, "prompt"),
    ("negative id", completion(prompt=[1, -2]), 400, "prompt"),
    ("prompt number", completion(prompt=5), 400, "prompt"),
    ("logprobs negative", completion(logprobs=-1), 400, "logprobs"),
    ("logprobs above 20", completion(logprobs=21), 400, "logprobs"),
    ("completion guided_choice", completion(guided_choice=[""]), 400, "guided_choice"),
    ("suffix", completion(suffix="end"), 400, "suffix"),
    ("prompt_embeds two", completion(prompt=None, prompt_embeds=["A", "B"]), 400, "prompt_embeds"),
    ("prompt_embeds and prompt", completion(prompt_embeds="AAAA"), 400, "prompt"),
    ("prompt_embeds echo", completion(prompt=None, prompt_embeds="AAAA", echo=True), 400, "echo"),
    ("best_of", completion(best_of=3), 400, "best_of"),
    ("max_tokens negative", completion(max_tokens=-1), 400, "max_tokens"),
    ("temperature high", completion(temperature=3), 400, "temperature"),
    ("stream_options no stream", completion(stream_options={}), 400, "stream_options"),
]


@pytest.mark.parametrize("body", GOOD_CHAT)
def test_good_chat_bodies_parse(body: bytes) -> None:
    req = parse_chat_request(body)
    assert req.model == "m"
    assert isinstance(chat_generation_params(req), GenerationParams)


@pytest.mark.parametrize(
    ("case", "body", "status", "param"), BAD_CHAT, ids=[c[0] for c in BAD_CHAT]
)
def test_bad_chat_bodies(case: str, body: bytes, status: int, param: str | None) -> None:
    err = error_of(parse_chat, body)
    assert (err.status, err.param) == (status, param), err.message
    assert err.type == "invalid_request_error"
    assert err.message


@pytest.mark.parametrize(
    ("case", "body", "status", "param"), BAD_COMPLETION, ids=[c[0] for c in BAD_COMPLETION]
)
def test_bad_completion_bodies(case: str, body: bytes, status: int, param: str | None) -> None:
    err = error_of(parse_completion, body)
    assert (err.status, err.param) == (status, param), err.message


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [("hi", "hi"), ([1, 2, 3], [1, 2, 3]), (["hi"], "hi"), ([[4, 5]], [4, 5]), ([7], [7])],
)
def test_prompt_forms(prompt: Any, expected: Any) -> None:
    assert parse_completion_request(completion(prompt=prompt)).prompt_value() == expected


def test_error_messages_name_the_problem() -> None:
    assert "JSON" in error_of(parse_chat, b'{"model": ').message
    assert "object" in error_of(parse_chat, b"[]").message
    assert "'model'" in error_of(parse_chat, b'{"messages": []}').message
    assert "temperature" in error_of(parse_chat, chat(temperature="x")).message
    assert "not supported" in error_of(parse_chat, chat(logit_bias={"1": 2})).message
    assert (
        "not in tools"
        in error_of(parse_chat, chat(tools=[_tool("f")], tool_choice=_named("g"))).message
    )


def test_error_body_is_openai_shaped() -> None:
    err = OpenAIError(404, "The model 'x' does not exist", type="not_found_error", param="model")
    assert json.loads(err.body()) == {
        "error": {
            "message": "The model 'x' does not exist",
            "type": "not_found_error",
            "param": "model",
            "code": None,
        }
    }


def test_chat_params_resolve_defaults() -> None:
    params = chat_generation_params(parse_chat_request(chat()))
    assert params == GenerationParams(
        SamplingParams(
            max_tokens=0,  # none given
            temperature=1.0,
            top_p=1.0,
            seed=None,
            ignore_eos=False,
            min_tokens=0,
            top_k=0,
            min_p=0.0,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            repetition_penalty=1.0,
        ),
        n=1,
        stop=(),
        stream=False,
        include_usage=False,
        tools=ToolPlan("none"),
    )
    assert params.max_tokens is None


INTEGER = {"type": "integer"}


def test_logprobs_and_echo_resolve() -> None:
    chat_params = chat_generation_params(parse_chat_request(chat(logprobs=True, top_logprobs=3)))
    assert (chat_params.sampling.logprobs, chat_params.sampling.prompt_logprobs) == (3, None)
    assert chat_generation_params(parse_chat_request(chat(logprobs=True))).sampling.logprobs == 0
    plain_chat = chat_generation_params(parse_chat_request(chat(top_logprobs=0)))
    assert plain_chat.sampling.logprobs is None
    params = completion_generation_params(
        parse_completion_request(completion(logprobs=2, echo=True))
    )
    assert (params.sampling.logprobs, params.sampling.prompt_logprobs, params.echo) == (2, 2, True)
    plain = completion_generation_params(parse_completion_request(completion(echo=True)))
    assert (plain.sampling.logprobs, plain.sampling.prompt_logprobs, plain.echo) == (
        None,
        None,
        True,
    )


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"response_format": {"type": "json_object"}}, StructuredOutput(json_object=True)),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": {"type": "integer"}},
                }
            },
            StructuredOutput(json_schema='{"type": "integer"}'),
        ),
        ({"guided_json": '{"type": "string"}'}, StructuredOutput(json_schema='{"type": "string"}')),
        ({"guided_regex": "[a-z]+"}, StructuredOutput(regex="[a-z]+")),
        ({"guided_choice": ["x", "y"]}, StructuredOutput(choice=("x", "y"))),
        ({"guided_grammar": "root ::= 'a'"}, StructuredOutput(grammar="root ::= 'a'")),
        ({"structured_outputs": {"json_object": True}}, StructuredOutput(json_object=True)),
        ({"response_format": {"type": "text"}}, None),
    ],
)
def test_constraints_reach_the_params(fields: dict[str, Any], expected: Any) -> None:
    chat_params = chat_generation_params(parse_chat_request(chat(**fields)))
    assert chat_params.sampling.structured == expected
    params = completion_generation_params(parse_completion_request(completion(**fields)))
    assert params.sampling.structured == expected


def test_tool_choices_become_constraints() -> None:
    weather = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tools = [_tool("get_weather", weather), _tool("get_time")]
    named = chat_generation_params(
        parse_chat_request(chat(tools=tools, tool_choice=_named("get_weather")))
    )
    assert named.tools is not None and named.tools.mode == "named"
    assert named.sampling.structured == StructuredOutput(json_schema=json.dumps(weather))
    required = chat_generation_params(
        parse_chat_request(chat(tools=tools, tool_choice="required", parallel_tool_calls=False))
    )
    forced = required.sampling.structured
    assert forced is not None and forced.json_schema is not None
    schema = json.loads(forced.json_schema)
    assert (schema["type"], schema["minItems"], schema["maxItems"]) == ("array", 1, 1)
    names = [b["properties"]["name"]["enum"] for b in schema["items"]["anyOf"]]
    assert names == [["get_weather"], ["get_time"]]
    auto = chat_generation_params(parse_chat_request(chat(tools=tools)))
    assert auto.tools is not None and auto.tools.mode == "auto" and auto.sampling.structured is None
    assert auto.tools.template_tools() == tools


def test_chat_params_carry_values() -> None:
    body = chat(
        max_tokens=9,
        max_completion_tokens=4,
        temperature=0.5,
        top_p=0.9,
        seed=3,
        n=2,
        stop="END",
        ignore_eos=True,
        min_tokens=2,
        top_k=40,
        min_p=0.05,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.1,
        stream=True,
        stream_options={"include_usage": True},
    )
    params = chat_generation_params(parse_chat_request(body))
    sampling = params.sampling
    assert (sampling.top_k, sampling.min_p, sampling.repetition_penalty) == (40, 0.05, 1.1)
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.5, -0.5)
    assert params.max_tokens == 4  # max_completion_tokens wins
    assert (sampling.temperature, sampling.top_p, sampling.seed, params.n) == (0.5, 0.9, 3, 2)
    assert (params.stop, sampling.ignore_eos, sampling.min_tokens) == (("END",), True, 2)
    assert (params.stream, params.include_usage) == (True, True)
    # each choice's engine request: the resolved budget, and its own seed
    assert params.choice_sampling(100, 1) == msgspec.structs.replace(
        sampling, max_tokens=100, seed=4
    )


def test_top_k_minus_one_is_off() -> None:
    assert chat_generation_params(parse_chat_request(chat(top_k=-1))).sampling.top_k == 0


def test_completion_params() -> None:
    req = parse_completion_request(completion(max_tokens=7, stop=["a", "b"], stream=True))
    params = completion_generation_params(req)
    assert (params.max_tokens, params.stop, params.stream) == (7, ("a", "b"), True)
    assert params.include_usage is False


def test_messages_as_dicts_flatten_text_parts() -> None:
    messages = [
        {
            "role": "system",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        },
        {"role": "assistant", "content": None, "name": "bot"},
    ]
    req = parse_chat_request(chat(messages=messages))
    assert req.messages_as_dicts() == [
        {"role": "system", "content": "ab"},
        {"role": "assistant", "content": "", "name": "bot"},
    ]


@pytest.mark.parametrize(
    ("requested", "prompt_len", "context", "expected"),
    [(None, 10, 100, 90), (5, 10, 100, 5), (90, 10, 100, 90), (None, 99, 100, 1)],
)
def test_resolve_max_tokens(
    requested: int | None, prompt_len: int, context: int, expected: int
) -> None:
    assert resolve_max_tokens(requested, prompt_len, context) == expected


@pytest.mark.parametrize(
    ("requested", "prompt_len", "param", "total"),
    [(91, 10, "max_tokens", 101), (None, 100, "messages", 100), (5, 120, "messages", 125)],
)
def test_resolve_max_tokens_rejects(
    requested: int | None, prompt_len: int, param: str, total: int
) -> None:
    with pytest.raises(OpenAIError) as info:
        resolve_max_tokens(requested, prompt_len, 100)
    err = info.value
    assert (err.status, err.param, err.code) == (400, param, "context_length_exceeded")
    assert err.message.startswith(
        f"This model's maximum context length is 100 tokens. However, you requested {total} "
        f"tokens ({prompt_len} in the messages, {requested or 0} in the completion)."
    )


def test_resolve_max_tokens_prompt_param() -> None:
    with pytest.raises(OpenAIError) as info:
        resolve_max_tokens(None, 200, 100, prompt_param="prompt")
    assert info.value.param == "prompt"


def test_reasoning_effort_reaches_the_chat_template() -> None:
    def kwargs(**body: Any) -> dict[str, Any]:
        return parse_chat_request(chat(**body)).template_kwargs()

    assert kwargs() == {}
    assert kwargs(reasoning_effort="high") == {"reasoning_effort": "high", "enable_thinking": True}
    assert kwargs(reasoning_effort="none")["enable_thinking"] is False
    # the request's own template kwargs win
    own = kwargs(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True})
    assert own == {"enable_thinking": True, "reasoning_effort": "none"}
