"""The Batch API with the official openai client: files uploaded, batches run on every endpoint,
lines the API refuses in the error file, a bad file refused by line, a cancel, a batch that
expires, and a batch that goes on when its frontend and a worker are killed, each custom_id
answered once."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from base.ports import free_port
from tests.support.clients import openai_client
from tests.support.fleet import Fleet
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration
MODEL = "jetfleet-tiny"


@pytest.fixture(scope="module")
def fleet2(nats_server, tmp_path_factory) -> Iterator[tuple[Fleet, openai.OpenAI]]:
    f = Fleet(nats_server.url, tmp_path_factory.mktemp("batches"))
    try:
        f.add_worker()
        f.add_worker()
        url = f.start_frontend("--router", "round-robin")
        yield f, openai_client(url)
    finally:
        f.stop()


def _jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "\n".join(json.dumps(x) for x in lines).encode() + b"\n"


def _chat_line(i: int, **body: Any) -> dict[str, Any]:
    default = {"model": MODEL, "messages": [{"role": "user", "content": f"n{i}"}], "max_tokens": 3}
    return {
        "custom_id": f"r{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": default | body,
    }


def _run(client: openai.OpenAI, content: bytes, endpoint: str, timeout: float = 120) -> Any:
    f = client.files.create(file=("in.jsonl", content), purpose="batch")
    batch = client.batches.create(
        input_file_id=f.id,
        endpoint=endpoint,
        completion_window="24h",  # type: ignore[arg-type]
    )
    return wait_until(lambda: _finished(client, batch.id), timeout, "batch finished")


def _finished(client: openai.OpenAI, batch_id: str) -> Any:
    b = client.batches.retrieve(batch_id)
    return b if b.status in ("completed", "failed", "cancelled", "expired") else None


def _lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines() if x]


BAD = {  # bodies the chat API refuses (400 / 404)
    7: {"messages": []},
    500: {"max_tokens": -1},
    993: {"model": "no-such-model"},
}


def _thousand() -> bytes:
    return _jsonl([_chat_line(i, **BAD.get(i, {})) for i in range(1000)])


def _check_thousand(client: openai.OpenAI, done: Any) -> None:
    assert done.status == "completed", done
    assert done.request_counts.total == 1000
    assert (done.request_counts.completed, done.request_counts.failed) == (997, 3)
    out, err = _lines(client, done.output_file_id), _lines(client, done.error_file_id)
    assert len(out) == 997 and len(err) == 3
    ids = [x["custom_id"] for x in out + err]
    assert sorted(ids) == sorted(f"r{i}" for i in range(1000))  # each once
    assert {x["custom_id"] for x in err} == {f"r{i}" for i in BAD}
    assert {x["response"]["status_code"] for x in err} <= {400, 404}
    assert all(x["response"]["body"]["error"]["message"] for x in err)
    answer = out[0]["response"]
    assert answer["status_code"] == 200 and answer["body"]["object"] == "chat.completion"
    assert answer["body"]["usage"]["completion_tokens"] == 3


def test_a_thousand_line_batch_answers_each_line_once_with_its_errors_apart(fleet2):
    _, client = fleet2
    _check_thousand(client, _run(client, _thousand(), "/v1/chat/completions"))


def test_a_small_batch_runs_on_each_other_endpoint(fleet2):
    _, client = fleet2
    bodies = {
        "/v1/completions": {"model": MODEL, "prompt": "Hi", "max_tokens": 2},
        "/v1/embeddings": {"model": MODEL, "input": "Hi"},
        "/v1/responses": {"model": MODEL, "input": "Hi", "max_output_tokens": 2},
    }
    kinds = {"/v1/completions": "text_completion", "/v1/embeddings": "list"}
    for url, body in bodies.items():
        lines = [
            {"custom_id": f"{url}-{i}", "method": "POST", "url": url, "body": body}
            for i in range(3)
        ]
        done = _run(client, _jsonl(lines), url)
        assert done.status == "completed" and done.request_counts.completed == 3, (url, done)
        out = _lines(client, done.output_file_id)
        assert {x["response"]["body"]["object"] for x in out} == {kinds.get(url, "response")}


def test_a_file_that_is_not_jsonl_fails_the_batch_naming_its_line(fleet2):
    _, client = fleet2
    content = _jsonl([_chat_line(0)]) + b"{not json\n" + _jsonl([_chat_line(1)])
    f = client.files.create(file=("bad.jsonl", content), purpose="batch")
    b = client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert b.status == "failed" and b.errors is not None
    [error] = b.errors.data
    assert (error.code, error.line) == ("invalid_json_line", 2)
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=("x.jsonl", b"{}"), purpose="fine-tune")
    with pytest.raises(openai.NotFoundError):
        client.batches.create(
            input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h"
        )


def test_a_cancelled_batch_ends_cancelled_with_what_was_answered(fleet2):
    _, client = fleet2
    lines = [_chat_line(i, max_tokens=2000) for i in range(400)]  # ~15 s
    f = client.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch")
    b = client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_until(
        lambda: client.batches.retrieve(b.id).request_counts.completed > 0, 60, "some answered"
    )
    assert client.batches.cancel(b.id).status in ("cancelling", "cancelled")
    done = wait_until(lambda: _finished(client, b.id), 60, "batch cancelled")
    assert done.status == "cancelled"
    answered = _lines(client, done.output_file_id) + _lines(client, done.error_file_id)
    assert 0 < len(answered) < 400
    assert len({x["custom_id"] for x in answered}) == len(answered)


def test_a_batch_past_its_completion_window_expires_with_what_was_answered(fleet2):
    """A frontend whose completion window is 4 s: a batch of ~15 s ends ``expired``; every line
    is in one of its files once, those not run as ``batch_expired`` errors (OpenAI's shape)."""
    f, _ = fleet2
    url = f.start_frontend(
        "--router", "round-robin", "--batch-window", "4", name="frontend-window", port=free_port()
    )  # fmt: skip
    try:
        client = openai_client(url)
        lines = [_chat_line(i, max_tokens=2000) for i in range(400)]
        file = client.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch")
        b = client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert b.expires_at is not None and b.expires_at - b.created_at == 4
        done = wait_until(lambda: _finished(client, b.id), 60, "batch expired")
        assert done.status == "expired" and done.expired_at is not None
        answered, errors = _lines(client, done.output_file_id), _lines(client, done.error_file_id)
        assert len({x["custom_id"] for x in answered + errors}) == len(answered + errors) == 400
        expired = [x for x in errors if x["error"] and x["error"]["code"] == "batch_expired"]
        assert expired and all(x["response"] is None for x in expired)
        counts = done.request_counts
        assert counts is not None
        assert (counts.completed, counts.failed) == (len(answered), len(errors))
    finally:  # gone before the next test, whose batch another frontend must take over
        f.group.stop("frontend-window")


def test_a_batch_goes_on_when_its_frontend_and_a_worker_are_killed(fleet2):
    """Its frontend (short lease) is SIGKILLed and a worker too while it runs: the other
    frontend takes it over and runs the lines not yet answered; each is answered once."""
    f, survivor = fleet2
    url = f.start_frontend(
        "--router", "round-robin", "--takeover-lease", "2", "--batch-concurrency", "4",
        name="frontend-doomed", port=free_port(),
    )  # fmt: skip
    doomed = openai_client(url)
    file = doomed.files.create(file=("in.jsonl", _thousand()), purpose="batch")
    b = doomed.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_until(
        lambda: survivor.batches.retrieve(b.id).request_counts.completed >= 100, 60, "100 answered"
    )
    f.group.children["frontend-doomed"].proc.send_signal(signal.SIGKILL)
    f.kill(f"{f.prefix}-worker-1")
    done = wait_until(lambda: _finished(survivor, b.id), 180, "batch finished elsewhere")
    _check_thousand(survivor, done)
    assert "batch_taking_over" in f.log("frontend")
