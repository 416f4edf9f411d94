"""Anthropic Messages (with the official anthropic client) and OpenAI Responses (with the openai
client) against a real fleet: the same generation path as chat, shaped as each API says."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.e2e.test_openai_surface import TOOLS, WEATHER

pytestmark = pytest.mark.integration

MODEL = "jetfleet-tiny"
ANTHROPIC_TOOLS = [
    {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS
]
RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]


@pytest.fixture
def claude(fleet) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=fleet.base_url, api_key="unused", max_retries=0)


# ---------------------------------------------------------------------------- messages
def test_messages_whole_and_streamed_agree(claude):
    args: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 24,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Hello"}],
        "extra_body": {"seed": 5},
    }
    whole = claude.messages.create(**args)
    assert whole.type == "message" and whole.role == "assistant" and whole.model == MODEL
    assert whole.id.startswith("msg_") and whole.stop_reason == "max_tokens"
    [block] = whole.content
    assert block.type == "text" and len(block.text) > 0
    assert whole.usage.output_tokens == 24
    assert whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0) > 5
    with claude.messages.stream(**args) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == block.text == final.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 24


def test_messages_stop_sequences(claude):
    args: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 60,
        "messages": [{"role": "user", "content": "Count"}],
        "extra_body": {"seed": 8},
    }
    text = claude.messages.create(**args).content[0].text
    stop = text[20:22]
    r = claude.messages.create(**args, stop_sequences=[stop])
    assert (r.stop_reason, r.stop_sequence) == ("stop_sequence", stop)
    assert r.content[0].text == text[: text.index(stop)]


@pytest.mark.parametrize("stream", [False, True])
def test_messages_tool_use(claude, stream):
    args: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 300,
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": ANTHROPIC_TOOLS,
        "tool_choice": {"type": "tool", "name": "get_weather"},
    }
    if stream:
        with claude.messages.stream(**args) as s:
            message = s.get_final_message()
    else:
        message = claude.messages.create(**args)
    assert message.stop_reason == "tool_use"
    [use] = [b for b in message.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER)


def test_a_coding_agent_turn_runs_through_messages(claude):
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the build."}]
    first = claude.messages.create(
        model=MODEL,
        max_tokens=300,
        system="You are a coding agent.",
        messages=messages,
        tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "any"},
    )
    use = next(b for b in first.content if b.type == "tool_use")
    messages.append({"role": "assistant", "content": [b.model_dump() for b in first.content]})
    messages.append(
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "ok: 3 hits"}],
        }
    )
    with claude.messages.stream(
        model=MODEL,
        max_tokens=16,
        system="You are a coding agent.",
        messages=messages,
        tools=ANTHROPIC_TOOLS,
    ) as stream:
        answer = "".join(stream.text_stream)
    assert len(answer) > 0


def test_count_tokens_matches_the_chat_prompt(claude, client):
    messages = [{"role": "user", "content": "How many tokens is this?"}]
    counted = claude.messages.count_tokens(model=MODEL, system="S", messages=messages)
    chat = client.chat.completions.create(
        model=MODEL, max_tokens=1, messages=[{"role": "system", "content": "S"}, *messages]
    )
    assert counted.input_tokens == chat.usage.prompt_tokens


def test_messages_errors_are_anthropic_shaped(claude, fleet):
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(
            model=MODEL, max_tokens=0, messages=[{"role": "user", "content": "x"}]
        )
    assert err.value.body["type"] == "error"
    assert err.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in err.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(
            model="nope", max_tokens=4, messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(anthropic.BadRequestError, match="image"):
        claude.messages.create(
            model=MODEL,
            max_tokens=4,
            messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}],
        )


# --------------------------------------------------------------------------- responses
def test_responses_whole_and_streamed_agree(client):
    args: dict[str, Any] = {
        "model": MODEL,
        "instructions": "Be brief.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hello"}]}],
        "max_output_tokens": 20,
        "extra_body": {"seed": 3},
    }
    r = client.responses.create(**args)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    [item] = r.output
    assert item.type == "message" and item.role == "assistant"
    assert r.output_text == item.content[0].text and len(r.output_text) > 0
    assert r.usage.output_tokens == 20 and r.usage.input_tokens > 0

    events = list(client.responses.create(**args, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == r.output_text == events[-1].response.output_text


def test_responses_with_tools_and_an_agent_turn(client):
    first = client.responses.create(
        model=MODEL,
        input="Weather in Lima?",
        tools=RESPONSES_TOOLS,
        tool_choice="required",
        max_output_tokens=300,
    )
    [call] = [i for i in first.output if i.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), dict(TOOLS_BY_NAME[call.name]))
    events = list(
        client.responses.create(
            model=MODEL,
            input=[
                {"role": "user", "content": "Weather in Lima?"},
                {
                    "type": "function_call",
                    "call_id": call.call_id,
                    "name": call.name,
                    "arguments": call.arguments,
                },
                {"type": "function_call_output", "call_id": call.call_id, "output": "18C"},
            ],
            tools=RESPONSES_TOOLS,
            max_output_tokens=12,
            stream=True,
        )
    )
    assert events[-1].response.output_text


@pytest.mark.parametrize("stream", [False, True])
def test_responses_named_tool_streams_a_function_call(client, stream):
    args: dict[str, Any] = {
        "model": MODEL,
        "input": "Weather?",
        "tools": RESPONSES_TOOLS,
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 300,
    }
    if stream:
        events = list(client.responses.create(**args, stream=True))
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        response = events[-1].response
        assert len(done) == 1 and response.status == "completed"
    else:
        response = client.responses.create(**args)
    [call] = [i for i in response.output if i.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)


def test_responses_text_format_json_schema(client):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    r = client.responses.create(
        model=MODEL,
        input="A number",
        text={"format": {"type": "json_schema", "name": "num", "schema": schema}},
        max_output_tokens=100,
    )
    jsonschema.validate(json.loads(r.output_text), schema)


def test_responses_refusals(client):
    with pytest.raises(openai.NotFoundError, match="resp_1"):
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_1")
    with pytest.raises(openai.BadRequestError, match="store"):
        client.responses.create(model=MODEL, input="x", background=True, store=False)
    with pytest.raises(openai.BadRequestError, match="web_search"):
        client.responses.create(model=MODEL, input="x", tools=[{"type": "web_search"}])


TOOLS_BY_NAME = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


# -------------------------------------------------------------------------- embeddings
def test_embeddings_are_deterministic_unit_vectors_of_the_hidden_size(client):
    texts = ["the cat sat", "the dog ran", "the cat sat"]
    r = client.embeddings.create(model=MODEL, input=texts)  # the client asks for base64
    assert r.object == "list" and r.model == MODEL and [d.index for d in r.data] == [0, 1, 2]
    vectors = [d.embedding for d in r.data]
    assert all(len(v) == 64 for v in vectors)  # the shipped card's hidden_size
    assert all(abs(sum(x * x for x in v) - 1) < 1e-5 for v in vectors)
    assert vectors[0] == vectors[2] != vectors[1]
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(len(t) for t in texts)
    floats = client.embeddings.create(model=MODEL, input="the cat sat", encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(vectors[0], abs=1e-6)
    ids = client.embeddings.create(model=MODEL, input=[list(b"the cat sat")])
    assert ids.data[0].embedding == vectors[0]  # the same tokens, the same vector


def test_embeddings_dimensions_and_refusals(client):
    short = client.embeddings.create(model=MODEL, input="abc", dimensions=8).data[0].embedding
    full = client.embeddings.create(model=MODEL, input="abc").data[0].embedding
    assert len(short) == 8 and abs(sum(x * x for x in short) - 1) < 1e-5
    scale = full[0] / short[0]
    assert [x * scale for x in short] == pytest.approx(full[:8], abs=1e-5)  # Matryoshka cut
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model=MODEL, input="abc", dimensions=65)
    with pytest.raises(openai.BadRequestError, match="input"):
        client.embeddings.create(model=MODEL, input=[])
    with pytest.raises(openai.BadRequestError, match="context length"):
        client.embeddings.create(model=MODEL, input="x" * 9000)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input="abc")


# ------------------------------------------------------------------ against the SDKs' schemas
def _sse(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(x[6:]) for x in lines if x.startswith("data: ") and x != "data: [DONE]"]


def test_every_body_and_event_validates_against_the_official_sdk_types(fleet):
    """Strict pydantic validation (the clients themselves only ``construct``) of what each
    endpoint sends, with logprobs, tool calls and usage in it."""
    from anthropic.types import Message, RawMessageStreamEvent
    from openai.types import Completion, CreateEmbeddingResponse
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    url = fleet.base_url
    tools = {"tools": TOOLS, "tool_choice": "required"}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200}
    with httpx.Client(base_url=url, timeout=30) as http:

        def post(path: str, body: dict[str, Any]) -> Any:
            r = http.post(path, json=body)
            assert r.status_code == 200, r.text
            return r.json()

        def stream(path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
            with http.stream("POST", path, json={**body, "stream": True}) as r:
                assert r.status_code == 200
                return _sse(list(r.iter_lines()))

        for body in (chat | {"logprobs": True, "top_logprobs": 2}, chat | tools):
            ChatCompletion.model_validate(post("/v1/chat/completions", body), strict=True)
            opts = {"stream_options": {"include_usage": True}}
            for event in stream("/v1/chat/completions", body | opts):
                ChatCompletionChunk.model_validate(event, strict=True)
        completion = {"model": MODEL, "prompt": "hi", "max_tokens": 4, "logprobs": 2}
        Completion.model_validate(post("/v1/completions", completion), strict=True)
        # with echo the first prompt token has null logprobs, as OpenAI's API (and vLLM) send
        # them, though the SDK's type says float: everything else must still validate
        echoed = post("/v1/completions", completion | {"echo": True})
        lp = echoed["choices"][0]["logprobs"]
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        lp["token_logprobs"][0], lp["top_logprobs"][0] = 0.0, {}
        Completion.model_validate(echoed, strict=True)
        embeddings = {"model": MODEL, "input": ["a", "b"], "encoding_format": "float"}
        CreateEmbeddingResponse.model_validate(post("/v1/embeddings", embeddings), strict=True)

        responses = {
            "model": MODEL,
            "input": "hi",
            "max_output_tokens": 200,
            "tools": RESPONSES_TOOLS,
            "tool_choice": "required",
        }
        Response.model_validate(post("/v1/responses", responses), strict=True)
        adapter = TypeAdapter(ResponseStreamEvent)
        for event in stream("/v1/responses", responses):
            adapter.validate_python(event, strict=True)

        messages = {
            "model": MODEL,
            "max_tokens": 200,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": ANTHROPIC_TOOLS,
            "tool_choice": {"type": "any"},
        }
        Message.model_validate(post("/v1/messages", messages), strict=True)
        events = TypeAdapter(RawMessageStreamEvent)
        for event in stream("/v1/messages", messages):
            events.validate_python(event, strict=True)
