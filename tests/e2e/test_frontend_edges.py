"""The frontend's edges as a user meets them: ``--api-key`` through the official OpenAI client,
and SIGTERM while a stream is in flight (the stream finishes, new connections are refused, the
process closes its connections and exits 0)."""

from __future__ import annotations

import asyncio
import json
import signal

import httpx
import openai
import pytest

from base.ports import free_port
from tests.e2e.test_fleet_lifecycle import _count
from tests.support.clients import openai_client
from tests.support.fleet import Fleet
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

M = "jetfleet-tiny"


async def test_ready_once_a_model_is_known_and_still_ready_with_no_worker_left(
    nats_server, tmp_path
) -> None:
    """``/ready`` is the frontend's readiness for a load balancer: not before any worker has
    published its model, and still after the last worker left (a fleet scaled to zero gets its
    worker back from the demand the frontend still receives); ``live_models`` says which models
    have a worker now."""
    f = Fleet(nats_server.url, tmp_path)
    try:
        url = f.start_frontend("--router", "round-robin", serving_first=False)
        async with httpx.AsyncClient(timeout=10) as client:
            r = await client.get(f"{url}/ready")
            assert r.status_code == 503 and "no model card" in r.json()["reasons"][0], r.text
            worker = f.add_worker()

            async def serving() -> bool:  # ready as soon as the card is out, live a moment later
                r = await client.get(f"{url}/ready")
                return r.status_code == 200 and r.json()["live_models"] == [M]

            assert await wait_for(serving, 30)
            assert f.terminate(worker) == 0
            assert await wait_for(lambda: _gone(client, url), 30)
            r = await client.get(f"{url}/ready")
            assert r.status_code == 200 and r.json() == {
                "ready": True, "reasons": [], "live_models": []
            }  # fmt: skip
    finally:
        f.stop()


async def _gone(client: httpx.AsyncClient, url: str) -> bool:
    return (await client.get(f"{url}/ready")).json()["live_models"] == []


def test_api_key_is_required_on_v1_and_nowhere_else(fleet: Fleet) -> None:
    url = fleet.start_frontend(
        "--router", "round-robin", "--api-key", "s3cret", name="frontend-key", port=free_port()
    )
    for key in ("wrong", ""):
        client = openai_client(url, api_key=key or "none")
        with pytest.raises(openai.AuthenticationError) as refused:
            client.completions.create(model=M, prompt="hi", max_tokens=2)
        assert refused.value.status_code == 401
        assert refused.value.code == "invalid_api_key"
    r = httpx.get(f"{url}/v1/models")  # no header at all
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    ok = openai_client(url, api_key="s3cret")
    done = ok.completions.create(model=M, prompt="hi", max_tokens=2)
    assert done.usage is not None and done.usage.completion_tokens == 2
    for path in ("/health", "/ready", "/metrics"):  # probes and scrapes need no key
        assert httpx.get(f"{url}{path}").status_code == 200, path


async def test_sigterm_lets_the_stream_in_flight_finish(nats_server, tmp_path) -> None:
    f = Fleet(nats_server.url, tmp_path, worker_args=("--speedup", "2"))
    try:
        f.add_worker()
        url = f.start_frontend("--router", "round-robin")
        await wait_for(lambda: _count(f, 1), timeout=20)
        frontend = f.group.children["frontend"].proc
        body = {"model": M, "prompt": "drain", "max_tokens": 60, "stream": True}
        body["stream_options"] = {"include_usage": True}
        texts, done, usage = 0, False, None
        async with (
            httpx.AsyncClient(timeout=60) as client,
            client.stream("POST", f"{url}/v1/completions", json=body) as r,
        ):
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    assert "error" not in event, event
                    texts += bool(event["choices"] and event["choices"][0]["text"])
                    usage = event.get("usage") or usage
                    if texts == 2:
                        frontend.send_signal(signal.SIGTERM)
                        await wait_for(lambda: _refused(url), timeout=10)
        assert done and usage is not None  # every token after the signal still arrived
        assert usage["completion_tokens"] == 60
        assert await asyncio.to_thread(frontend.wait, 30) == 0
        assert "frontend_stopped" in f.log("frontend")  # it closed NATS and Redis, then left
    finally:
        f.stop()


def _refused(url: str) -> bool:
    try:
        httpx.get(f"{url}/health", timeout=2)
    except httpx.TransportError:
        return True
    return False
