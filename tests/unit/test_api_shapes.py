"""The Responses and Messages translations and shapes, without servers: what a body means as a
chat request, and the event sequences and objects an answer becomes."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from router.frontend import anthropic, responses_api
from router.frontend.errors import OpenAIError
from router.frontend.openai_protocol import ChatCompletionRequest
from router.frontend.output import Delta, OutCall
from router.frontend.responses_api import ResponsesRequest
from router.frontend.responses_shape import ResponsesShape
from router.frontend.shapes import FullChoice, usage_body

USAGE = usage_body(prompt_tokens=10, completion_tokens=4, cached_tokens=3)
CALL = OutCall(0, "call_abc", "search", '{"q": "x"}')


def given(value: Any) -> Any:
    """A request as plain data, the fields it leaves unset (None) left out."""
    if isinstance(value, msgspec.Struct):
        value = msgspec.to_builtins(value)
    if isinstance(value, dict):
        return {k: given(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [given(v) for v in value]
    return value


def messages_chat(body: dict[str, Any]) -> ChatCompletionRequest:
    return anthropic.to_chat_request(anthropic.parse_messages_request(json.dumps(body).encode()))


def responses_chat(body: dict[str, Any]) -> ChatCompletionRequest:
    return responses_api.to_chat_request(
        responses_api.parse_responses_request(json.dumps(body).encode())
    )


def events(stream: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in stream.decode().split("\n\n"):
        if not block:
            continue
        kind, data = block.split("\n")
        assert kind.startswith("event: ") and data.startswith("data: ")
        body = json.loads(data.removeprefix("data: "))
        assert body["type"] == kind.removeprefix("event: ")
        out.append((body["type"], body))
    return out


# ---------------------------------------------------------------------------- messages
def test_a_messages_body_means_this_chat_request() -> None:
    body = {
        "model": "m",
        "max_tokens": 9,
        "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        "messages": [
            {"role": "user", "content": "Find it."},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "look", "signature": "s"},
                    {"type": "text", "text": "Searching."},
                    {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "a"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": "none",
                        "is_error": True,
                    },
                    {"type": "text", "text": "Again."},
                ],
            },
        ],
        "tools": [{"name": "search", "input_schema": {"type": "object"}, "description": "d"}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"],
        "temperature": 0.5,
        "stream": True,
    }
    original = anthropic.parse_messages_request(json.dumps(body).encode())
    assert (original.model, original.max_tokens, original.stop_sequences) == ("m", 9, ["END"])
    chat = anthropic.to_chat_request(original)
    assert given(chat) == {
        "model": "m",
        "max_tokens": 9,
        "stream": True,
        "temperature": 0.5,
        "stop": ["END"],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Find it."},
            {
                "role": "assistant",
                "content": "Searching.",
                "reasoning_content": "look",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "search", "arguments": '{"q": "a"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: none"},
            {"role": "user", "content": "Again."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "search",
                    "parameters": {"type": "object"},
                    "description": "d",
                },
            }
        ],
        "tool_choice": "required",
        "parallel_tool_calls": False,
    }


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": "m", "max_tokens": 1, "messages": []}, "messages"),
        (
            {"model": "m", "max_tokens": 1, "messages": [{"role": "system", "content": "x"}]},
            "messages.0.role",
        ),
        (
            {
                "model": "m",
                "max_tokens": 1,
                "temperature": 1.5,
                "messages": [{"role": "user", "content": "x"}],
            },
            "temperature",
        ),
        (  # found by the HTTP fuzz: a string here was a 500
            {
                "model": "m",
                "max_tokens": 1,
                "temperature": "",
                "messages": [{"role": "user", "content": "x"}],
            },
            "temperature",
        ),
        (
            {
                "model": "m",
                "max_tokens": 1,
                "tool_choice": {"type": "maybe"},
                "messages": [{"role": "user", "content": "x"}],
            },
            "tool_choice",
        ),
        (
            {
                "model": "m",
                "max_tokens": 1,
                "tools": [{"type": "bash_20250124", "name": "bash"}],
                "messages": [{"role": "user", "content": "x"}],
            },
            "tools.0.type",
        ),
        (
            {
                "model": "m",
                "max_tokens": 1,
                "stop_sequences": ["a", "b", "c", "d", "e"],
                "messages": [{"role": "user", "content": "x"}],
            },
            "stop_sequences",
        ),
        (
            {
                "model": "m",
                "max_tokens": 1,
                "thinking": {"type": "adaptive"},
                "messages": [{"role": "user", "content": "x"}],
            },
            "thinking.type",
        ),
    ],
)
def test_bad_messages_bodies_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as err:
        messages_chat(body)
    assert err.value.status == 400 and err.value.param == param
    assert json.loads(anthropic.error_body(err.value))["error"]["type"] == "invalid_request_error"


def test_a_streamed_message_opens_and_closes_one_block_per_kind() -> None:
    shape = anthropic.MessagesShape("msg-r1", 0, "m")
    shape.prompt_tokens = 10
    stream = shape.start(1)
    stream += shape.delta_chunk(0, Delta(reasoning="hmm"), None)
    stream += shape.delta_chunk(0, Delta(reasoning=" ok", content="Hi"), None)
    stream += shape.delta_chunk(0, Delta(content="!"), None)
    shape.finish("tool_calls", None)
    stream += shape.delta_chunk(0, Delta(tool_calls=[CALL]), "tool_calls")
    stream += shape.end(USAGE, False)
    got = events(stream)
    kinds = [
        k
        if k not in ("content_block_start", "content_block_delta")
        else f"{k}:{(e.get('content_block') or e.get('delta'))['type']}:{e['index']}"
        for k, e in got
    ]
    assert kinds == [
        "message_start",
        "content_block_start:thinking:0",
        "content_block_delta:thinking_delta:0",
        "content_block_delta:thinking_delta:0",
        "content_block_stop",
        "content_block_start:text:1",
        "content_block_delta:text_delta:1",
        "content_block_delta:text_delta:1",
        "content_block_stop",
        "content_block_start:tool_use:2",
        "content_block_delta:input_json_delta:2",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert got[0][1]["message"]["usage"]["input_tokens"] == 10
    assert json.loads(got[10][1]["delta"]["partial_json"]) == {"q": "x"}
    assert got[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert got[-2][1]["usage"]["output_tokens"] == 4


def test_a_whole_message() -> None:
    shape = anthropic.MessagesShape("msg-r1", 0, "m")
    shape.finish("stop", "END")
    body = json.loads(shape.full([FullChoice("Hi", "stop", "hmm", [CALL])], USAGE))
    assert [b["type"] for b in body["content"]] == ["thinking", "text", "tool_use"]
    assert body["content"][2] == {
        "type": "tool_use",
        "id": "toolu_abc",
        "name": "search",
        "input": {"q": "x"},
    }
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", "END")
    assert body["usage"] == {
        "input_tokens": 7,
        "output_tokens": 4,
        "cache_read_input_tokens": 3,
        "cache_creation_input_tokens": 0,
    }
    cut = anthropic.MessagesShape("msg-r", 0, "m")
    cut.finish("length", None)
    empty = json.loads(cut.full([FullChoice("", "length")], USAGE))
    assert empty["content"] == [{"type": "text", "text": ""}]
    assert empty["stop_reason"] == "max_tokens"


# --------------------------------------------------------------------------- responses
def test_a_responses_body_means_this_chat_request() -> None:
    body = {
        "model": "m",
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Find it."}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "c1", "name": "search", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "search", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "a"},
            {"type": "function_call_output", "call_id": "c2", "output": {"n": 1}},
        ],
        "tools": [{"type": "function", "name": "search", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "search"},
        "max_output_tokens": 7,
        "top_logprobs": 2,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        "store": True,
    }
    got = given(responses_chat(body))
    assert got["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Find it."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": c, "type": "function", "function": {"name": "search", "arguments": "{}"}}
                for c in ("c1", "c2")
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a"},
        {"role": "tool", "tool_call_id": "c2", "content": '{"n": 1}'},
    ]
    assert got["tool_choice"] == {"type": "function", "function": {"name": "search"}}
    assert (got["max_tokens"], got["top_logprobs"], got["logprobs"]) == (7, 2, True)
    assert got["response_format"]["json_schema"]["schema"] == {"type": "object"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"model": "m", "input": [{"type": "computer_call"}]}, "input[0].type"),
        (
            {"model": "m", "input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0].type",
        ),
        ({"model": "m", "input": "x", "tools": [{"type": "file_search"}]}, "tools[0].type"),
        ({"model": "m", "input": "x", "text": {"format": {"type": "yaml"}}}, "text.format"),
        ({"model": "m", "input": "x", "truncation": "auto"}, "truncation"),
        ({"model": "m", "input": "x", "include": ["file_search_call.results"]}, "include"),
        ({"model": "m", "input": "x", "reasoning": "high"}, "reasoning"),
    ],
)
def test_bad_responses_bodies_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as err:
        responses_chat(body)
    assert err.value.status == 400 and err.value.param == param


def test_a_streamed_response_builds_its_items_in_order() -> None:
    shape = ResponsesShape("resp_r1", 5, "m", ResponsesRequest(max_output_tokens=9))
    stream = shape.start(1)
    stream += shape.delta_chunk(0, Delta(reasoning="think"), None)
    stream += shape.delta_chunk(0, Delta(content="Hi"), None, [{"token": "Hi", "logprob": -1.0}])
    shape.finish("tool_calls", None)
    stream += shape.delta_chunk(0, Delta(content="!", tool_calls=[CALL]), "tool_calls")
    stream += shape.end(USAGE, False)
    got = events(stream)
    assert [e["sequence_number"] for _, e in got] == list(range(len(got)))
    assert [k for k, _ in got] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = got[-1][1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message", "function_call"]
    assert final["output"][1]["content"][0]["text"] == "Hi!"
    assert final["output"][1]["content"][0]["logprobs"] == [{"token": "Hi", "logprob": -1.0}]
    assert final["output"][2]["call_id"] == "call_abc" and final["status"] == "completed"
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == 3


def test_a_whole_response_cut_by_length_is_incomplete() -> None:
    shape = ResponsesShape("resp_r1", 5, "m", ResponsesRequest())
    shape.finish("length", None)
    body = json.loads(shape.full([FullChoice("Hi", "length", "why")], USAGE))
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [i["type"] for i in body["output"]] == ["reasoning", "message"]
    assert body["usage"]["output_tokens"] == 4 and body["usage"]["total_tokens"] == 14


def test_logprobs_of_held_back_text_reach_the_message_with_the_text() -> None:
    """A parser may hold a token's text back (a possible marker): its logprobs go out with the
    text when it comes, never dropped."""
    shape = ResponsesShape("resp_r1", 5, "m", ResponsesRequest())
    stream = shape.start(1)
    stream += shape.delta_chunk(0, Delta(), None, [{"token": "<", "logprob": -0.5}])
    stream += shape.delta_chunk(0, Delta(content="<b"), None, [{"token": "b", "logprob": -0.1}])
    shape.finish("stop", None)
    stream += shape.end(USAGE, False)
    got = events(stream)
    deltas = [e for k, e in got if k == "response.output_text.delta"]
    assert [len(d["logprobs"]) for d in deltas] == [2]
    message = got[-1][1]["response"]["output"][0]
    assert [lp["token"] for lp in message["content"][0]["logprobs"]] == ["<", "b"]


# ------------------------------------------- streamed and whole agree, and both are typed
ANSWERS = [
    pytest.param(FullChoice("", "stop"), id="nothing"),
    pytest.param(FullChoice("", "stop", "only thought"), id="reasoning-only"),
    pytest.param(FullChoice("Hi!", "stop"), id="text"),
    pytest.param(FullChoice("Hi!", "tool_calls", "hmm", [CALL]), id="everything"),
    pytest.param(FullChoice("", "tool_calls", "", [CALL]), id="call-only"),
]


def _streamed(shape: Any, c: FullChoice) -> bytes:
    stream = shape.start(1)
    lps = [{"token": "Hi!", "logprob": -0.5, "bytes": [72, 105, 33], "top_logprobs": []}]
    stream += shape.delta_chunk(0, Delta(reasoning=c.reasoning), None)
    stream += shape.delta_chunk(0, Delta(content=c.content), None, lps if c.content else None)
    shape.finish(c.reason, None)
    stream += shape.delta_chunk(0, Delta(tool_calls=list(c.calls)), c.reason)
    return stream + shape.end(USAGE, False)


@pytest.mark.parametrize("answer", ANSWERS)
def test_a_streamed_message_is_the_whole_one_and_every_event_is_typed(answer) -> None:
    from anthropic.types import Message, RawMessageStreamEvent
    from pydantic import TypeAdapter

    adapter = TypeAdapter(RawMessageStreamEvent)
    got = events(_streamed(anthropic.MessagesShape("msg-r1", 0, "m"), answer))
    for _, e in got:
        adapter.validate_python(e, strict=True)
    blocks: list[dict[str, Any]] = []
    for kind, e in got:
        if kind == "content_block_start":
            blocks.append(dict(e["content_block"]))
        elif kind == "content_block_delta":
            d = e["delta"]
            if d["type"] == "input_json_delta":
                blocks[-1]["input"] = json.loads(d["partial_json"])
            else:
                field = "thinking" if d["type"] == "thinking_delta" else "text"
                blocks[-1][field] += d[field]
    whole_shape = anthropic.MessagesShape("msg-r1", 0, "m")
    whole_shape.finish(answer.reason, None)
    whole = json.loads(whole_shape.full([answer], USAGE))
    Message.model_validate(whole, strict=True)
    assert blocks == whole["content"]


@pytest.mark.parametrize("answer", ANSWERS)
def test_a_streamed_response_is_the_whole_one_and_every_event_is_typed(answer) -> None:
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    adapter = TypeAdapter(ResponseStreamEvent)
    got = events(_streamed(ResponsesShape("resp_r1", 5, "m", ResponsesRequest()), answer))
    for _, e in got:
        adapter.validate_python(e, strict=True)
    streamed = got[-1][1]["response"]
    Response.model_validate(streamed, strict=True)
    whole_shape = ResponsesShape("resp_r1", 5, "m", ResponsesRequest())
    whole_shape.finish(answer.reason, None)
    whole = json.loads(
        whole_shape.full([FullChoice(**{**answer.__dict__, "logprobs": None})], USAGE)
    )
    Response.model_validate(whole, strict=True)

    def items(r: dict[str, Any]) -> list[tuple[str, str]]:
        return [
            (i["type"], i.get("arguments") or "".join(c["text"] for c in i.get("content", ())))
            for i in r["output"]
        ]

    assert items(streamed) == items(whole)


def test_thinking_and_reasoning_switches_reach_the_chat_request() -> None:
    msg = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    for kind, on in (("enabled", True), ("disabled", False)):
        body = msg | {"thinking": {"type": kind, "budget_tokens": 1024}}
        assert messages_chat(body).chat_template_kwargs == {"enable_thinking": on}
    resp = {"model": "m", "input": "x", "reasoning": {"effort": "low", "summary": "auto"}}
    resp |= {"include": ["message.output_text.logprobs"], "truncation": "disabled"}
    assert responses_chat(resp).reasoning_effort == "low"
