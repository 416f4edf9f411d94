"""One request id, followed through every process's log: the frontend honours and echoes
X-Request-Id, writes one access-log line per request, and the worker logs the request's start
and finish under the same id."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _events(text: str, request_id: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        if request_id in line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


async def test_a_request_id_joins_the_frontend_and_worker_logs(fleet) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.post(
            f"{fleet.base_url}/v1/completions",
            json={"model": "jetfleet-tiny", "prompt": "follow me", "max_tokens": 5},
            headers={"x-request-id": "trace-me-123", "traceparent": TRACEPARENT},
        )
        assert r.status_code == 200, r.text
        assert r.headers["x-request-id"] == "trace-me-123"
        rid = r.json()["id"]
        assert rid == "cmpl-trace-me-123"
        bad = await client.post(f"{fleet.base_url}/v1/completions", json={"model": "nope"})
        assert bad.status_code in (400, 404) and bad.headers["x-request-id"]

    def access() -> list[dict]:
        return [e for e in _events(fleet.log("frontend"), rid) if e.get("event") == "request"]

    line = (await wait_for(access, timeout=10))[0]
    assert line["status"] == 200 and line["model"] == "jetfleet-tiny"
    assert line["completion_tokens"] == 5 and line["prompt_tokens"] > 0
    assert line["worker_id"] and line["attempts"] == 1 and line["ms"] > 0
    assert line["trace_id"] == TRACE_ID  # the caller's W3C trace, continued

    def worker_events() -> set[str]:
        logs = "".join(fleet.log(name) for name in fleet.group.children if "worker" in name)
        return {e.get("event") for e in _events(logs, rid)}

    assert await wait_for(lambda: {"request_started", "request_finished"} <= worker_events(), 10)
    logs = "".join(fleet.log(name) for name in fleet.group.children if "worker" in name)
    started = [e for e in _events(logs, rid) if e.get("event") == "request_started"]
    assert started[0]["trace_id"] == TRACE_ID  # through the NATS header to the worker
    rejected = bad.headers["x-request-id"]
    # the access line is written once the response has gone out: the client can read it first
    assert await wait_for(
        lambda: any(
            e.get("status") == bad.status_code for e in _events(fleet.log("frontend"), rejected)
        ),
        10,
    )
