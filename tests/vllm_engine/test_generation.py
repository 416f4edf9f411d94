"""What a client asks of a real model, through the whole fleet (``jetfleet up --engine vllm``,
two SmolLM2 workers) with the official ``openai`` client: greedy answers, streaming, stop strings,
``n``, seeds, logprobs, structured output and tool calls, all computed by vLLM itself."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import jsonschema
import pytest
from openai import AsyncOpenAI

from tests.support.up import Up

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

M = "SmolLM2-135M-Instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
async def client(real_fleet: Up) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=f"{real_fleet.base_url}/v1", api_key="unused") as c:
        yield c


async def test_greedy_answer_is_paris(client: AsyncOpenAI) -> None:
    r = await client.chat.completions.create(model=M, messages=FRANCE, temperature=0, max_tokens=24)
    assert "Paris" in (r.choices[0].message.content or "")
    assert r.choices[0].finish_reason == "stop"  # the model ended it (<|im_end|>)
    assert r.usage is not None and r.usage.prompt_tokens > 20


async def test_a_stream_carries_the_same_answer(client: AsyncOpenAI) -> None:
    whole = await client.chat.completions.create(
        model=M, messages=FRANCE, temperature=0, max_tokens=24
    )
    stream = await client.chat.completions.create(
        model=M, messages=FRANCE, temperature=0, max_tokens=24, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    parts, usage, chunks = [], None, 0
    async for chunk in stream:
        chunks += 1
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    assert "".join(parts) == whole.choices[0].message.content
    assert chunks > 3  # streamed, not one block
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


async def test_a_stop_string_ends_the_answer_before_it(client: AsyncOpenAI) -> None:
    r = await client.chat.completions.create(
        model=M, messages=FRANCE, temperature=0, max_tokens=24, stop=["Paris"]
    )
    text = r.choices[0].message.content or ""
    assert "Paris" not in text and text.startswith("The capital of France is")
    assert r.choices[0].finish_reason == "stop"


async def test_max_tokens_ends_with_length(client: AsyncOpenAI) -> None:
    r = await client.chat.completions.create(
        model=M, messages=[{"role": "user", "content": "Write a long story."}], max_tokens=7
    )
    assert r.choices[0].finish_reason == "length" and r.usage and r.usage.completion_tokens == 7


async def test_n_choices_and_seeds(client: AsyncOpenAI) -> None:
    story = [{"role": "user", "content": "Tell me a story about a dragon."}]

    async def sample(seed: int, n: int = 1) -> list[str]:
        r = await client.chat.completions.create(
            model=M, messages=story, temperature=1.0, max_tokens=16, n=n, seed=seed
        )
        return [c.message.content or "" for c in r.choices]

    pair = await sample(7, n=2)
    assert len(pair) == 2 and pair[0] != pair[1]  # two samples, not one copied
    assert await sample(11) == await sample(11)  # a seed repeats vLLM's sampling
    assert await sample(11) != await sample(12)


async def test_logprobs_are_vllms(client: AsyncOpenAI) -> None:
    r = await client.chat.completions.create(
        model=M, messages=FRANCE, temperature=0, max_tokens=6, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert content is not None and len(content) == 6
    for tok in content:
        assert tok.logprob <= 0 and len(tok.top_logprobs) == 3
        best = max(tok.top_logprobs, key=lambda t: t.logprob)
        assert best.token == tok.token  # greedy: the chosen token is the most likely one
        assert best.logprob == pytest.approx(tok.logprob, abs=1e-4)
    assert "".join(t.token for t in content) == r.choices[0].message.content


async def test_completions_logprobs(client: AsyncOpenAI) -> None:
    r = await client.completions.create(
        model=M, prompt="The sky is", max_tokens=5, temperature=0, logprobs=2
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens and "".join(lp.tokens) == r.choices[0].text
    assert lp.top_logprobs and all(len(top) == 2 for top in lp.top_logprobs)


SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
    "additionalProperties": False,
}


async def test_json_schema_answers_parse(client: AsyncOpenAI) -> None:
    r = await client.chat.completions.create(
        model=M,
        messages=[{"role": "user", "content": "Give the capital of France as JSON."}],
        temperature=0,
        max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}},
    )
    answer = json.loads(r.choices[0].message.content or "")
    jsonschema.validate(answer, SCHEMA)
    assert answer["city"] == "Paris"


async def test_tool_choice_required_calls_a_tool(client: AsyncOpenAI) -> None:
    params = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    }
    r = await client.chat.completions.create(
        model=M,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        temperature=0,
        max_tokens=60,
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": params}}],
        tool_choice="required",
    )
    calls = r.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(calls[0].function.arguments), params)
    assert r.choices[0].finish_reason == "tool_calls"
