"""A client with only NATS: publish a Request on fleet.submit.{model}, read fleet.tok.{id}."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import nats
import pytest

from schemas import Request, SamplingParams, Subjects, TokenChunk, decode, encode

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def routed_fleet(fleet):
    fleet.start_router_service("--router", "round-robin")
    return fleet


async def test_raw_nats_client_gets_a_token_stream(routed_fleet):
    subjects = Subjects(routed_fleet.prefix)
    nc = await nats.connect(routed_fleet.nats_url)
    try:
        request = Request(
            request_id=f"raw-{uuid.uuid4().hex}",
            model="jetfleet-tiny",
            token_ids=tuple(b"Hello from a NATS-only client"),  # byte-level tokenizer
            sampling=SamplingParams(max_tokens=16, seed=4),
        )
        tokens = await nc.subscribe(subjects.tok(request.request_id))
        await nc.jetstream().publish(subjects.submit("jetfleet-tiny"), encode(request))
        chunks: list[TokenChunk] = []
        while not chunks or chunks[-1].finish_reason is None:
            chunks.append(decode((await tokens.next_msg(timeout=30)).data, TokenChunk))
    finally:
        await nc.close()
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert sum(len(c.token_ids) for c in chunks) == 16
    assert chunks[-1].finish_reason == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16
    assert "".join(c.text for c in chunks)


async def test_undecodable_submission_is_dead_lettered_and_routing_goes_on(routed_fleet):
    subjects = Subjects(routed_fleet.prefix)
    nc = await nats.connect(routed_fleet.nats_url)
    try:
        dlq = await nc.subscribe(subjects.dlq("router"))
        await nc.jetstream().publish(subjects.submit("jetfleet-tiny"), b"\xc1not msgpack")
        # 30 s, as for the stream above: pytest-xdist may run this test first on its worker,
        # so it waits for the router service's start (a process, on a loaded machine) too
        letter = await dlq.next_msg(timeout=30)
        assert b"not msgpack" in letter.data
    finally:
        await nc.close()
    await test_raw_nats_client_gets_a_token_stream(routed_fleet)


def test_publish_cli(routed_fleet):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "infra.cli",
            "publish",
            "--nats",
            routed_fleet.nats_url,
            "--subject-prefix",
            routed_fleet.prefix,
            "--max-tokens",
            "8",
            "--json",
            "Hi",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    chunks = [json.loads(line) for line in out.stdout.splitlines()]
    assert chunks[-1]["finish_reason"] == "length"
    assert sum(len(c.get("token_ids", [])) for c in chunks) == 8


def test_status_cli_json(routed_fleet):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "infra.cli",
            "status",
            "--json",
            "--nats",
            routed_fleet.nats_url,
            "--subject-prefix",
            routed_fleet.prefix,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["models"][0]["name"] == "jetfleet-tiny"
    live = [w for w in report["workers"] if w["status"] == "ready"]
    assert len(live) == 2
    assert all(w["role"] == "agg" and w["heartbeat_age_s"] < 5 for w in live)


def test_a_router_service_without_redis_says_so_in_one_line(fleet):
    done = subprocess.run(
        [
            sys.executable, "-m", "infra.cli", "router-service", "--nats", fleet.nats_url,
            "--subject-prefix", fleet.prefix, "--redis", "redis://127.0.0.1:1/0",
        ],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith("jetfleet")]
    assert len(lines) == 1 and "cannot reach Redis at redis://127.0.0.1:1/0" in lines[0]
    assert "Traceback" not in done.stderr
