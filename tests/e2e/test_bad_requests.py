"""Every bad request gets an OpenAI-style JSON error with the right 4xx — never a 500 or a hang."""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = pytest.mark.integration

M = "jetfleet-tiny"
MSG = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"

CASES = [
    ("malformed json", "POST", CHAT, b'{"model": "x", ', 400, None),
    ("not an object", "POST", CHAT, b"[1, 2]", 400, None),
    ("missing messages", "POST", CHAT, {"model": M}, 400, "messages"),
    ("unknown model", "POST", CHAT, {"model": "nope", "messages": MSG}, 404, "model"),
    (
        "temperature type",
        "POST",
        CHAT,
        {"model": M, "messages": MSG, "temperature": "hot"},
        400,
        "temperature",
    ),
    (
        "temperature range",
        "POST",
        CHAT,
        {"model": M, "messages": MSG, "temperature": 3},
        400,
        "temperature",
    ),
    ("top_p range", "POST", CHAT, {"model": M, "messages": MSG, "top_p": 0}, 400, "top_p"),
    (
        "max_tokens zero",
        "POST",
        CHAT,
        {"model": M, "messages": MSG, "max_tokens": 0},
        400,
        "max_tokens",
    ),
    ("n too big", "POST", CHAT, {"model": M, "messages": MSG, "n": 1000}, 400, "n"),
    (
        "bad role",
        "POST",
        CHAT,
        {"model": M, "messages": [{"role": "robot", "content": "x"}]},
        400,
        None,
    ),
    ("context exceeded", "POST", COMP, {"model": M, "prompt": "x" * 9000}, 400, None),
    (
        "max_tokens past context",
        "POST",
        COMP,
        {"model": M, "prompt": "hi", "max_tokens": 100000},
        400,
        None,
    ),
    ("prompt wrong type", "POST", COMP, {"model": M, "prompt": {"a": 1}}, 400, "prompt"),
    ("token id outside vocab", "POST", COMP, {"model": M, "prompt": [1, 2, 10**9]}, 400, "prompt"),
    (
        "stream_options without stream",
        "POST",
        CHAT,
        {"model": M, "messages": MSG, "stream_options": {"include_usage": True}},
        400,
        None,
    ),
    (
        "invalid utf-8 in a string",
        "POST",
        CHAT,
        b'{"model": "jetfleet-tiny", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
        400,
        None,
    ),
    (
        "nested 100k deep",
        "POST",
        CHAT,
        b'{"model": "jetfleet-tiny", "messages": [], "x": '
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}",
        400,
        None,
    ),
    ("wrong method", "GET", CHAT, None, 405, None),
    ("unknown path", "GET", "/v1/nothing", None, 404, None),
]


@pytest.mark.parametrize(
    ("name", "method", "path", "body", "status", "param"), CASES, ids=[c[0] for c in CASES]
)
def test_bad_request(fleet, name, method, path, body, status, param):
    content = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    r = httpx.request(
        method,
        fleet.base_url + path,
        content=content,
        headers={"content-type": "application/json"},
        timeout=10,
    )
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    assert err["message"]
    if param is not None:
        assert err["param"] == param


def test_fleet_still_serves_after_bad_requests(fleet):
    r = httpx.post(
        fleet.base_url + COMP, json={"model": M, "prompt": "ok", "max_tokens": 3}, timeout=10
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_a_body_over_the_limit_gets_413_and_a_large_prompt_fits(fleet):
    over = b'{"model": "jetfleet-tiny", "prompt": "' + b"x" * (33 << 20) + b'"}'
    r = httpx.post(fleet.base_url + COMP, content=over, timeout=60)
    assert r.status_code == 413, r.text
    assert "32 MiB" in r.json()["error"]["message"]
    # ~1 MB of JSON (the size of a 121k-token prompt) is read and judged on its tokens
    r = httpx.post(fleet.base_url + COMP, json={"model": M, "prompt": "ab " * 350_000}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_a_prompt_far_past_the_context_is_refused_from_a_prefix(fleet):
    r = httpx.post(
        fleet.base_url + COMP, json={"model": M, "prompt": "word " * 1_000_000}, timeout=60
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and "at least" in err["message"]


def test_refusals_are_counted_with_bounded_labels(fleet):
    httpx.post(fleet.base_url + CHAT, json={"model": "rand-a1", "messages": MSG}, timeout=10)
    httpx.post(fleet.base_url + CHAT, json={"model": M}, timeout=10)
    text = httpx.get(fleet.base_url + "/metrics", timeout=10).text
    assert 'model="rand-a1"' not in text  # a name a client made up is not a label value
    assert 'jetfleet_frontend_requests_total{endpoint="chat",model="unknown",status="404"}' in text
    assert 'jetfleet_frontend_requests_total{endpoint="chat",model="unknown",status="400"}' in text
