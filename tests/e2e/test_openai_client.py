"""The official openai client against a real fleet (frontend + 2 mocker workers + nats-server)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

MODEL = "jetfleet-tiny"


def test_models_lists_the_shipped_card(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_chat_non_streaming(client):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello there"}], max_tokens=12, seed=1
    )
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.model == MODEL
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "length"
    assert isinstance(choice.message.content, str) and len(choice.message.content) > 0
    assert r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens > len("Hello there")  # template tokens included
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_chat_streaming_with_usage(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Stream please"}],
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
        seed=3,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    # the same request without streaming gives the same text (deterministic for a seed)
    full = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Stream please"}], max_tokens=20, seed=3
    )
    assert full.choices[0].message.content == text


def test_completions_streaming_and_not(client):
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, seed=5)
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=8, seed=5, stream=True
        )
        if c.choices
    )
    assert streamed == r.choices[0].text


def test_n_choices_and_seeds_differ(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "two answers"}],
        max_tokens=10,
        n=2,
        seed=11,
    )
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert r.choices[0].message.content != r.choices[1].message.content
    assert r.usage.completion_tokens == 20


def test_stop_string_ends_the_answer(client):
    base = client.completions.create(model=MODEL, prompt="abc", max_tokens=30, seed=9)
    text = base.choices[0].text
    stop = text[10:13]
    assert len(stop) == 3
    r = client.completions.create(model=MODEL, prompt="abc", max_tokens=30, seed=9, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == text[: text.index(stop)]


def test_cached_tokens_reported_for_a_repeated_prompt(client):
    prompt = "the same long prompt " * 20
    client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, seed=1)
    # the second identical prompt, on whichever worker, at least on the one that saw it
    cached = []
    for _ in range(2):
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, seed=1)
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
    assert max(cached) >= 16 * ((len(prompt) - 1) // 16) - 16
