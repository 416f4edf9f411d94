"""``jetfleet up`` as a user runs it (autoscaled by default): embedded servers, a fleet that
answers, decisions that ``jetfleet replay planner --check`` reproduces, a clean stop on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis
from anthropic import Anthropic

from base.ports import free_port, port_is_open
from base.process import wait_http_ok
from infra.command import cli_command
from tests.support.clients import openai_client
from tests.support.up import running_up, up_argv
from tests.support.wait import wait_line, wait_until

pytestmark = pytest.mark.integration


def _replay_until(nats_url: str, intervals: int) -> subprocess.CompletedProcess[str]:
    """``replay planner --check`` once the planner has recorded ``intervals`` intervals."""
    argv = cli_command("replay", "planner", "--nats", nats_url, "--from", "5m", "--check")
    result: list[subprocess.CompletedProcess[str]] = []

    def enough() -> bool:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        result[:] = [done]
        m = re.search(r"(\d+) intervals, \d+ metric messages, \d+ decisions, 0 differ", done.stdout)
        return m is not None and int(m.group(1)) >= intervals

    wait_until(enough, 30, f"{intervals} planner intervals recorded and reproduced")
    return result[0]


FRONTEND_FAMILIES = {
    "jetfleet_frontend_requests": "counter",
    "jetfleet_frontend_time_to_first_token_seconds": "histogram",
    "jetfleet_frontend_inter_token_latency_seconds": "histogram",
    "jetfleet_frontend_request_duration_seconds": "histogram",
    "jetfleet_frontend_input_sequence_tokens": "histogram",
    "jetfleet_frontend_output_sequence_tokens": "histogram",
    "jetfleet_frontend_in_flight": "gauge",
    "jetfleet_frontend_tokenizer_cache_segments": "counter",
    "jetfleet_frontend_tokenizer_seconds": "histogram",
}
WORKER_FAMILIES = {
    "jetfleet_worker_requests_finished": "counter",
    "jetfleet_worker_request_duration_seconds": "histogram",
    "jetfleet_worker_num_preemptions": "counter",
    "jetfleet_worker_prefix_cache_queries": "counter",
    "jetfleet_worker_prefix_cache_hits": "counter",
    "jetfleet_worker_kv_usage": "gauge",
    "jetfleet_worker_num_running": "gauge",
}


def _families_have_their_types(url: str, want: dict[str, str]) -> None:
    """Parsed with prometheus-client's own parser: each family there, with its type."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=5) as r:
        families = {f.name: f.type for f in text_string_to_metric_families(r.read().decode())}
    assert {name: families.get(name) for name in want} == want


def _every_process_is_observable(out: Path, nats_url: str, port: int) -> None:
    """up lists an operations port for the frontend, indexer, router, planner and local
    connector; the workers advertise theirs in discovery (``jetfleet status``); each answers
    /metrics and /health."""
    found = re.search(r"metrics: (.*)", out.read_text())  # printed before "jetfleet is up"
    assert found, out.read_text()[-3000:]
    banner = found.group(1)
    urls = re.findall(r"(http://[0-9.:]+)/metrics", banner)
    assert f"http://127.0.0.1:{port}" in urls and len(urls) == 5  # + indexer, planner, router,
    assert re.search(r"connector http://[0-9.:]+/metrics", banner)  # and the local connector
    status = subprocess.run(
        cli_command("status", "--json", "--nats", nats_url), capture_output=True, text=True
    )
    assert status.returncode == 0, status.stderr
    workers = json.loads(status.stdout)["workers"]
    assert workers and all(w["metrics_url"] for w in workers)
    for url in urls + [w["metrics_url"] for w in workers]:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
            assert r.status == 200 and b"# TYPE" in r.read()
        if url != f"http://127.0.0.1:{port}":
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                assert json.loads(r.read())["status"] == "ok"
    # Prometheus discovery through the frontend: the workers and every other operations port
    services = set(urls) - {f"http://127.0.0.1:{port}"}

    def discovered() -> list[dict[str, Any]] | None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/discovery/prometheus") as r:
            targets: list[dict[str, Any]] = json.loads(r.read())
        found = {f"http://{t['targets'][0]}" for t in targets}
        return targets if found == services | {w["metrics_url"] for w in workers} else None

    targets = wait_until(discovered, 30, "every operations port discovered")
    components = sorted(t["labels"]["component"] for t in targets)
    assert components == sorted(
        ["connector", "indexer", "planner", "router"] + ["worker"] * len(workers)
    )
    _families_have_their_types(f"http://127.0.0.1:{port}/metrics", FRONTEND_FAMILIES)
    _families_have_their_types(f"{workers[0]['metrics_url']}/metrics", WORKER_FAMILIES)


def _started(out: Path, name: str) -> list[int]:
    return [
        int(e["pid"])
        for line in out.read_text().splitlines()
        if line.startswith("{")
        and (e := json.loads(line)).get("event") == "process_started"
        and e.get("name") == name
    ]


def _a_dead_component_is_restarted(out: Path, proc: subprocess.Popen) -> None:
    """kill -9 of the indexer: up notices, logs it and starts it again."""
    (first,) = _started(out, "indexer")
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: len(_started(out, "indexer")) == 2, 30, "the indexer is started again")
    assert "component_exited" in out.read_text()
    assert proc.poll() is None


def _docs_nats_snippet_streams(nats_url: str, tmp_path: Path) -> None:
    """The NATS-only client of docs/using/nats-clients.md, as printed there, against this ``up``."""
    page = Path(__file__).resolve().parents[2] / "docs" / "using" / "nats-clients.md"
    code = page.read_text().split("```python\n", 1)[1].split("```", 1)[0]
    assert "nats://127.0.0.1:14222" in code
    script = tmp_path / "snippet.py"
    script.write_text(code.replace("nats://127.0.0.1:14222", nats_url))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip(), "the snippet printed the streamed text"


AGENT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]


def _an_agent_session_runs_on_every_endpoint(port: int) -> None:
    """System prompt, tools, a call, its result, a streamed final answer: through chat
    completions, Responses and Anthropic Messages of this ``up``; and an embedding."""
    base = f"http://127.0.0.1:{port}"
    client = openai_client(base, api_key="none")
    system = {"role": "system", "content": "You are a coding agent."}
    messages: list[dict[str, Any]] = [system, {"role": "user", "content": "Run the tests."}]
    first = client.chat.completions.create(
        model="jetfleet-tiny",
        messages=messages,
        tools=AGENT_TOOLS,
        tool_choice="required",
        max_tokens=200,
    )
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "run_tests" and "path" in json.loads(call.function.arguments)
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "2 passed"},
    ]
    stream = client.chat.completions.create(
        model="jetfleet-tiny", messages=messages, tools=AGENT_TOOLS, max_tokens=8, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    tools = [{"type": "function", **t["function"]} for t in AGENT_TOOLS]
    r = client.responses.create(
        model="jetfleet-tiny",
        instructions="You are a coding agent.",
        input="Run the tests.",
        tools=tools,
        tool_choice="required",
        max_output_tokens=200,
    )
    fc = next(i for i in r.output if i.type == "function_call")
    events = list(
        client.responses.create(
            model="jetfleet-tiny",
            input=[
                {"role": "user", "content": "Run the tests."},
                {
                    "type": "function_call",
                    "call_id": fc.call_id,
                    "name": fc.name,
                    "arguments": fc.arguments,
                },
                {"type": "function_call_output", "call_id": fc.call_id, "output": "2 passed"},
            ],
            tools=tools,
            max_output_tokens=8,
            stream=True,
        )
    )
    assert events[-1].response.output_text

    claude = Anthropic(base_url=base, api_key="none", max_retries=0)
    anthropic_tools = [
        {"name": "run_tests", "input_schema": AGENT_TOOLS[0]["function"]["parameters"]}
    ]
    first_message = claude.messages.create(
        model="jetfleet-tiny",
        max_tokens=200,
        system="You are a coding agent.",
        messages=[{"role": "user", "content": "Run the tests."}],
        tools=anthropic_tools,
        tool_choice={"type": "any"},
    )
    use = next(b for b in first_message.content if b.type == "tool_use")
    with claude.messages.stream(
        model="jetfleet-tiny",
        max_tokens=8,
        system="You are a coding agent.",
        tools=anthropic_tools,
        messages=[
            {"role": "user", "content": "Run the tests."},
            {"role": "assistant", "content": [b.model_dump() for b in first_message.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "2 passed"}],
            },
        ],
    ) as s:
        assert "".join(s.text_stream)

    vector = client.embeddings.create(model="jetfleet-tiny", input="hello").data[0].embedding
    assert len(vector) == 64


def test_up_stops_everything_when_its_output_pipe_is_gone(tmp_path: Path) -> None:
    """``jetfleet up | tee log`` and Ctrl-C: tee dies with the terminal's SIGINT, up's cleanup
    then writes to a closed pipe; it must still stop every process, the servers included."""
    port = free_port()
    argv = up_argv(tmp_path, port, "--workers", "1", "--no-planner", "--log-format", "console")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    seen = b""
    while b"jetfleet is up" not in seen:
        line = proc.stdout.readline()
        assert line, seen.decode(errors="replace")[-3000:]
        seen += line
    children = [int(p) for p in re.findall(rb"pid=(\d+)", seen)]
    assert len(children) >= 5  # nats, redis, worker, indexer, router, frontend
    proc.stdout.close()  # the reader is gone, as tee after Ctrl-C
    proc.send_signal(signal.SIGINT)
    proc.wait(90)
    wait_until(lambda: not _pids_alive(children), 30, "every process up started exits")


def _pids_alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        alive.append(pid)
    return alive


def test_up_with_planner_serves_records_decisions_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "up.out"
    argv = up_argv(tmp_path, port, "--workers", "1", "--speedup", "20", "--interval", "1")
    with out.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_line(out, r"jetfleet is up", 90, proc)
        # up is up once its planner is: its start-up no longer competes with the first requests
        planner = re.search(r"planner (http://[0-9.:]+)/metrics", out.read_text())
        assert planner, out.read_text()[-3000:]
        with urllib.request.urlopen(f"{planner.group(1)}/ready", timeout=5) as r:
            assert r.status == 200
        nats_url = wait_line(out, r"NATS (nats://[0-9.:]+)", 5, proc).group(1)
        wait_http_ok(f"http://127.0.0.1:{port}/ready", 30)
        client = openai_client(f"http://127.0.0.1:{port}", api_key="none", max_retries=2)
        for i in range(5):
            r = client.chat.completions.create(
                model="jetfleet-tiny",
                messages=[{"role": "user", "content": f"hello {i}"}],
                max_tokens=8,
            )
            assert r.choices[0].finish_reason in ("length", "stop")
        _every_process_is_observable(out, nats_url, port)
        _an_agent_session_runs_on_every_endpoint(port)
        _docs_nats_snippet_streams(nats_url, tmp_path)
        published = subprocess.run(
            cli_command("publish", "Hello over NATS", "--nats", nats_url, "--max-tokens", "8"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert published.returncode == 0, published.stdout + published.stderr
        assert "finish_reason=length" in published.stdout
        replay = _replay_until(nats_url, intervals=3)  # one with the requests above
        assert replay.returncode == 0, replay.stdout + replay.stderr
        _a_dead_component_is_restarted(out, proc)
        children = [int(p) for p in re.findall(r'"pid": (\d+)', out.read_text())]
        assert len(children) >= 5  # nats, redis, connector, planner, indexer, frontend
        # The workers are the connector's children, not up's: their pids come from discovery.
        status = subprocess.run(
            cli_command("status", "--json", "--nats", nats_url), capture_output=True, text=True
        )
        workers = json.loads(status.stdout)["workers"]
        worker_pids = [int(w["pid"]) for w in workers]
        assert worker_pids and all(worker_pids) and _pids_alive(worker_pids) == worker_pids
        assert {w["managed_by"] for w in workers} == {"local"}  # the planner may stop them
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
    assert code == 0, out.read_text()[-3000:]
    workers = (tmp_path / "state" / "logs").glob("agg-*.log")
    assert [w for w in workers], "the connector started the workers"
    wait_until(lambda: not _pids_alive(children), 10, "every child process exits")
    wait_until(lambda: not _pids_alive(worker_pids), 10, "the connector's workers exit too")


def test_scaled_to_zero_a_request_brings_a_worker_back(tmp_path: Path) -> None:
    """--min-replicas agg=0: the planner scales the idle fleet to zero; a request then gets a 503
    with Retry-After after a bounded wait, counts as demand, and the planner starts a worker;
    the official client's retries then succeed."""
    port = free_port()
    out = tmp_path / "up.out"
    argv = up_argv(
        tmp_path,
        port,
        "--workers",
        "1",
        "--speedup",
        "20",
        "--interval",
        "1",
        "--min-replicas",
        "agg=0",
        "--scale-down-cooldown",
        "2",
        "--scale-up-cooldown",
        "1",
    )
    with out.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_line(out, r"jetfleet is up", 90, proc)
        nats_url = wait_line(out, r"NATS (nats://[0-9.:]+)", 5, proc).group(1)

        def ready_workers() -> int:
            done = subprocess.run(
                cli_command("status", "--json", "--nats", nats_url), capture_output=True, text=True
            )
            return sum(w["status"] == "ready" for w in json.loads(done.stdout)["workers"])

        wait_until(lambda: ready_workers() == 0, 60, "the idle fleet scales to zero")
        # still ready: a load balancer keeps routing to the frontend, and that demand is what
        # brings a worker back
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as r:
            assert r.status == 200 and json.load(r)["live_models"] == []
        client = openai_client(f"http://127.0.0.1:{port}", api_key="none", max_retries=6)
        started = time.monotonic()
        r = client.completions.create(model="jetfleet-tiny", prompt="wake up", max_tokens=4)
        assert r.usage is not None and r.usage.completion_tokens == 4
        assert time.monotonic() - started < 60
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)


def test_up_disagg_serves_through_prefill_and_decode_pools(tmp_path: Path) -> None:
    """``jetfleet up --disagg``: the connector starts a prefill and a decode pool, the planner
    plans both roles, a long prompt is prefilled remotely and a short one locally."""
    port = free_port()
    out = tmp_path / "up.out"
    argv = up_argv(
        tmp_path,
        port,
        "--disagg",
        "--prefill-workers",
        "1",
        "--decode-workers",
        "2",
        "--speedup",
        "20",
        "--interval",
        "1",
    )
    with out.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_line(out, r"jetfleet is up.*1 prefill, 2 decode", 90, proc)
        nats_url = wait_line(out, r"NATS (nats://[0-9.:]+)", 5, proc).group(1)
        client = openai_client(f"http://127.0.0.1:{port}", api_key="none")

        def roles() -> list[str]:
            status = subprocess.run(
                cli_command("status", "--json", "--nats", nats_url), capture_output=True, text=True
            )
            return sorted(w["role"] for w in json.loads(status.stdout)["workers"])

        wait_until(lambda: roles() == ["decode", "decode", "prefill"], 60, "three workers")
        status = subprocess.run(
            cli_command("status", "--nats", nats_url), capture_output=True, text=True
        )
        assert "3 live workers (2 decode, 1 prefill)" in status.stdout, status.stdout
        assert "serves generate, embed" in status.stdout
        long = "Every pool has its own job to do here. " * 80
        for content in (long, "short"):
            r = client.chat.completions.create(
                model="jetfleet-tiny",
                messages=[{"role": "user", "content": content}],
                max_tokens=16,
            )
            assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 16
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as m:
            text = m.read().decode()
        assert re.search(
            r'disagg_placements_total\{.*placement="remote",reason="long_uncached"', text
        )
        assert re.search(
            r'disagg_placements_total\{.*placement="local",reason="short_uncached(_on_prefill)?"',
            text,
        )
        planner_log = (tmp_path / "state" / "logs" / "planner.log").read_text()
        assert "prefill" in planner_log and "decode" in planner_log
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
    assert code == 0, out.read_text()[-3000:]


def test_up_with_host_tiers_loads_an_evicted_head_back(tmp_path: Path) -> None:
    """``jetfleet up --num-cpu-blocks N``: a head pushed out of the GPU comes back from host
    memory (counted as cached, and as cached_host in the metrics), and status shows the tier."""
    port = free_port()
    out = tmp_path / "up.out"
    argv = up_argv(
        tmp_path, port, "--workers", "1", "--no-planner", "--speedup", "20",
        "--num-gpu-blocks", "64", "--num-cpu-blocks", "512",
    )  # fmt: skip
    with out.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_line(out, r"jetfleet is up", 90, proc)
        nats_url = wait_line(out, r"NATS (nats://[0-9.:]+)", 5, proc).group(1)
        client = openai_client(f"http://127.0.0.1:{port}", api_key="none")
        head = "a system prompt that outlives the GPU cache, " * 16  # 720 bytes: 45 blocks

        def cached(prompt: str) -> int:
            r = client.completions.create(model="jetfleet-tiny", prompt=prompt, max_tokens=2)
            assert r.usage is not None and r.usage.prompt_tokens_details is not None
            return r.usage.prompt_tokens_details.cached_tokens or 0

        cached(head + "first")
        for i in range(3):  # 64 GPU blocks: these push the head out to the host tier
            cached(f"another prompt {i} that takes its room " * 18)
        assert cached(head + "again") >= 44 * 16
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as m:
            text = m.read().decode()
        host = re.search(r'frontend_tokens_total\{[^}]*kind="cached_host"[^}]*\} (\S+)', text)
        assert host is not None and float(host.group(1)) >= 44 * 16, text[-2000:]

        def worker() -> dict[str, Any]:
            status = subprocess.run(
                cli_command("status", "--json", "--nats", nats_url), capture_output=True, text=True
            )
            return json.loads(status.stdout)["workers"][0]

        wait_until(lambda: (worker().get("host_kv_usage") or 0) > 0, 30, "host tier reported")
        assert worker()["num_cpu_blocks"] == 512
        status = subprocess.run(
            cli_command("status", "--nats", nats_url), capture_output=True, text=True
        )
        assert "HOST%" in status.stdout, status.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
    assert code == 0, out.read_text()[-3000:]


def test_up_packs_workers_into_replica_processes(tmp_path: Path) -> None:
    """``up --no-planner --workers 5 --workers-per-process 2``: three worker processes (2, 2,
    1 workers), every worker registered and serving, all of them drained by the stop."""
    with running_up(tmp_path, 5, "--workers-per-process", "2", "--speedup", "20") as up:
        rows = up.workers()
        assert len(rows) == 5
        by_pid: dict[int, list[str]] = {}
        for row in rows:
            by_pid.setdefault(row["pid"], []).append(row["worker_id"])
        assert sorted(map(len, by_pid.values())) == [1, 2, 2]
        assert len({row["metrics_url"] for row in rows}) == 3  # one operations port a process
        assert "5 agg in 3 processes" in up.log.read_text()
        client = openai_client(up.base_url, api_key="none")
        r = client.completions.create(model="jetfleet-tiny", prompt="hello", max_tokens=4)
        assert r.usage is not None and r.usage.completion_tokens == 4
        logs = up.log.parent / "state" / "logs"
    assert up.proc.returncode == 0, up.log.read_text()[-3000:]
    drained = "".join(p.read_text() for p in logs.glob("worker-*.log")).count('"worker_drained"')
    assert drained == 5


def test_up_on_a_nats_that_does_not_answer_says_so_and_exits(tmp_path: Path) -> None:
    """``up --nats URL`` whose server is not there: a clear message and a non-zero exit within
    seconds, not an endless wait (nor one a Ctrl-C cannot end)."""
    dead = f"nats://127.0.0.1:{free_port()}"
    argv = up_argv(tmp_path, free_port(), "--nats", dead, "--workers", "1", "--no-planner")
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"cannot set up NATS at {dead}" in done.stdout
    assert time.monotonic() - started < 30


def test_up_on_a_redis_that_does_not_answer_says_so_and_exits(tmp_path: Path) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    argv = up_argv(tmp_path, free_port(), "--redis", dead, "--workers", "1", "--no-planner")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"cannot reach Redis at {dead}" in done.stdout


def test_up_with_redis_shards_runs_on_an_embedded_redis_cluster(tmp_path: Path) -> None:
    """``--redis-shards 3``: the Redis up starts is a 3-master Redis Cluster, the fleet is given
    its seed URL, and the kv router's index lives in 3 shards, one per master: a repeated prompt
    is served from cache, and prompts of different branches are indexed on every node."""
    with running_up(tmp_path, 2, "--redis-shards", "3") as fleet:
        assert "(seed of the embedded cluster of 3 masters)" in fleet.log.read_text()
        with redis.Redis.from_url(fleet.redis_url) as r:
            info = r.execute_command("CLUSTER", "INFO").decode()
            nodes = r.execute_command("CLUSTER", "NODES").decode().splitlines()
        assert "cluster_state:ok" in info and "cluster_size:3" in info
        ports = [int(line.split()[1].split("@")[0].rsplit(":", 1)[1]) for line in nodes]
        client = openai_client(fleet.base_url)
        prompts = [f"branch {i}: " + "the same long context, " * 12 for i in range(12)]
        for p in prompts:
            assert client.completions.create(model="jetfleet-tiny", prompt=p, max_tokens=2)

        def cached() -> bool:
            again = client.completions.create(
                model="jetfleet-tiny", prompt=prompts[0], max_tokens=2
            )
            details = again.usage.prompt_tokens_details if again.usage else None
            return bool(details and details.cached_tokens)

        wait_until(cached, timeout=20)

        def blocks_on(port: int) -> int:
            with redis.Redis(port=port) as node:
                return sum(node.hlen(k) for k in node.scan_iter(match="jf:*:blk:*"))

        wait_until(lambda: all(blocks_on(p) > 0 for p in ports), timeout=20)
    assert not any(port_is_open("127.0.0.1", port) for port in ports)  # Ctrl-C stopped them


def test_up_says_which_port_of_a_redis_cluster_is_in_use(tmp_path: Path) -> None:
    """A cluster node listens on its port and on port + 10000: a taken bus port is named."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        bus = taken.getsockname()[1]
        base = bus - 10_000 - 1  # node 1's bus port is the taken one
        argv = up_argv(tmp_path, free_port(), "--workers", "1", "--no-planner")
        argv[argv.index("--redis-port") + 1] = str(base)
        done = subprocess.run(
            [*argv, "--redis-shards", "3"], capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 1, done.stdout + done.stderr
    # (the ports beside it are any other process's to take meanwhile: named too, then)
    assert f"127.0.0.1:{bus} (--redis-port + 1 + 10000, cluster bus)" in done.stdout
    assert "already in use" in done.stdout
    assert not (tmp_path / "state").exists()


def test_up_on_a_port_in_use_says_so_in_one_line(tmp_path: Path) -> None:
    """Nothing is started (no half fleet, no traceback): one sentence naming the port, exit 1;
    and the frontend alone on that port says the same of itself."""
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            up_argv(tmp_path, port, "--workers", "1", "--no-planner"),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 1
        assert done.stdout.strip() == (
            f"jetfleet up: 127.0.0.1:{port} (--port) already in use (another fleet? choose "
            "other ports)"
        )
        assert "Traceback" not in done.stderr and not (tmp_path / "state").exists()
        fe = subprocess.run(
            cli_command(
                "frontend", "--port", str(port), "--nats", "nats://127.0.0.1:1",
                "--router", "round-robin",
            ),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert fe.returncode == 1 and "Traceback" not in fe.stderr
        assert f"cannot listen on 127.0.0.1:{port}: it is in use" in fe.stderr


def test_a_signal_during_start_up_stops_up_at_once(tmp_path: Path) -> None:
    """SIGTERM while ``up`` waits for its NATS (here one that never answers, so start-up lasts
    seconds): up stops what it started and exits at once (128 + SIGTERM), not when the wait
    gives up."""
    dead = f"nats://127.0.0.1:{free_port()}"
    argv = up_argv(
        tmp_path, free_port(), "--nats", dead, "--workers", "1", "--no-planner",
        "--log-format", "console",
    )  # fmt: skip
    out = tmp_path / "up.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    try:
        redis_pid = int(wait_line(out, r"server_started.*?pid=(\d+)", 30, proc).group(1))
        wait_line(out, r"nats_error.*jetfleet-infra-init", 30, proc)  # in the NATS wait
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    finally:
        proc.kill()
    text = out.read_text(errors="replace")
    assert code == 128 + signal.SIGTERM, text[-3000:]
    assert "interrupted during start-up" in text
    assert time.monotonic() - signalled < 5, "up went on waiting for NATS after the signal"
    wait_until(lambda: not _pids_alive([redis_pid]), 10, "the embedded Redis stops")
