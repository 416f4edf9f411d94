"""The operator's CLI paths the docs name, run as a user runs them (subprocesses, real
servers): ``jetfleet servers``, ``jetfleet infra init``, ``jetfleet replay traffic``."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from pathlib import Path

import httpx
import nats
import pytest
import redis
from redis.cluster import RedisCluster

from base.redis_slots import slot_range, tag_for_range
from infra.command import cli_command
from schemas import Subjects
from schemas.streams import fleet_topology
from tests.support.clients import run_cli
from tests.support.fleet import Fleet
from tests.support.wait import wait_for, wait_line

pytestmark = pytest.mark.integration

M = "jetfleet-tiny"


def test_servers_runs_nats_and_redis_until_ctrl_c(tmp_path: Path) -> None:
    out = tmp_path / "servers.out"
    argv = cli_command(
        "servers", "--nats-port", "0", "--redis-port", "0", "--state-dir", str(tmp_path / "s"),
        "--log-format", "console",
    )  # fmt: skip
    with out.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    try:
        m = wait_line(out, r"NATS +(\S+)\nRedis +(\S+)", 30, proc)
        nats_url, redis_url = m.group(1), m.group(2)
        r = redis.Redis.from_url(redis_url)
        assert r.ping() and r.set("k", "v") and r.get("k") == b"v"
        r.close()

        async def jetstream_answers() -> None:
            nc = await nats.connect(nats_url)
            await nc.jetstream().account_info()  # JetStream is on
            await nc.close()

        asyncio.run(jetstream_answers())
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(30)
    assert code == 0, out.read_text()
    assert out.read_text().count("server_stopped") == 2


def test_servers_with_redis_shards_runs_a_redis_cluster_until_ctrl_c(tmp_path: Path) -> None:
    out = tmp_path / "servers.out"
    argv = cli_command(
        "servers", "--nats-port", "0", "--redis-port", "0", "--redis-shards", "3",
        "--state-dir", str(tmp_path / "s"), "--log-format", "console",
    )  # fmt: skip
    with out.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    try:
        m = wait_line(out, r"\nRedis +(\S+) \(Redis Cluster seed; every node: ([^)]+)\)", 60, proc)
        seed, nodes = m.group(1), m.group(2).split()
        assert len(set(nodes)) == 3 and seed == nodes[0]
        for url in nodes:
            with redis.Redis.from_url(url) as r:
                info = r.execute_command("CLUSTER", "INFO").decode()
            assert "cluster_state:ok" in info and "cluster_known_nodes:3" in info
        keys = [f"{tag_for_range('cli', *slot_range(i, 3))}:k" for i in range(3)]
        with RedisCluster.from_url(seed) as rc:
            for key in keys:
                assert rc.set(key, key) and rc.get(key) == key.encode()
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(30)
    assert code == 0, out.read_text()
    assert out.read_text().count("server_stopped") == 4  # NATS and the 3 nodes


async def test_infra_init_creates_every_stream_and_bucket_twice_over(nats_url: str) -> None:
    prefix = "init" + str(int(time.time() * 1000) % 10**8)
    for _ in range(2):  # idempotent: the second run changes nothing and succeeds
        done = await run_cli("infra", "init", "--nats", nats_url, "--subject-prefix", prefix)
        assert done.returncode == 0, done.stderr
    topology = fleet_topology(Subjects(prefix))
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        for stream in topology.streams:
            assert (await js.stream_info(stream.name)).config.subjects
        for bucket in topology.buckets:
            await js.key_value(bucket.name.removeprefix("KV_"))
        for store in topology.object_stores:
            await js.object_store(store.name.removeprefix("OBJ_"))
    finally:
        await nc.close()


async def test_replay_traffic_command_sends_recorded_requests_again(fleet: Fleet) -> None:
    since = time.time() - 1
    async with httpx.AsyncClient(timeout=30) as client:
        for i in range(4):
            r = await client.post(
                f"{fleet.base_url}/v1/completions",
                json={"model": M, "prompt": f"record me {i}", "max_tokens": 3},
            )
            assert r.status_code == 200, r.text
    before = _finished(fleet)
    done = await run_cli(
        "replay", "traffic", "--nats", fleet.nats_url, "--subject-prefix", fleet.prefix,
        "--from", str(since), "--speed", "10", "--router", "round-robin",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["recorded_requests"] == 4 and report["replayed"] == 4
    assert report["errors"] == 0, report["error_samples"]
    assert report["e2e_ms"]["p50"] > 0
    await wait_for(lambda: _finished(fleet) == before + 4, timeout=10)  # the workers ran them


def _finished(fleet: Fleet) -> int:
    names = [n for n in fleet.group.children if n.startswith("worker")]
    return sum(fleet.log(n).count('"request_finished"') for n in names)


@pytest.mark.parametrize(
    "command",
    [("status",), ("status", "--json"), ("publish", "hello"), ("infra", "init")],
    ids=["status", "status-json", "publish", "infra-init"],
)
def test_a_tool_against_a_nats_that_is_not_there_says_so_and_exits(
    command: tuple[str, ...],
) -> None:
    """No endless retry (nats-py reads max_reconnect_attempts 0 as unlimited): one clear line
    and a non-zero exit within seconds."""
    from base.ports import free_port

    dead = f"nats://127.0.0.1:{free_port()}"
    started = time.monotonic()
    done = subprocess.run(
        cli_command(*command, "--nats", dead), capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert f"cannot reach NATS at {dead}" in done.stderr, done.stderr[-2000:]
    assert time.monotonic() - started < 30


async def test_ctl_runs_a_control_op_on_a_worker_and_says_when_none_answers(
    nats_server, tmp_path: Path
) -> None:
    fleet = Fleet(nats_server.url, tmp_path)
    try:
        worker = fleet.add_worker()
        common = ("--nats", fleet.nats_url, "--subject-prefix", fleet.prefix)

        async def answers() -> bool:
            return (await run_cli("ctl", worker, "health", *common)).returncode == 0

        await wait_for(answers, timeout=30)
        health = await run_cli("ctl", worker, "health", *common)
        reply = json.loads(health.stdout)
        assert reply["ok"] is True and reply["data"]["in_flight"] == 0
        cleared = await run_cli("ctl", worker, "clear_kv", *common)
        assert cleared.returncode == 0 and json.loads(cleared.stdout)["ok"] is True
        loaded = await run_cli("ctl", worker, "lora_load", "name=x", "path=/a", *common)
        assert loaded.returncode == 0, loaded.stdout + loaded.stderr
        listed = json.loads((await run_cli("ctl", worker, "lora_list", *common)).stdout)
        assert listed["data"]["loras"] == ["x"]
        refused = await run_cli("ctl", worker, "lora_unload", "name=y", *common)
        assert refused.returncode == 1 and json.loads(refused.stdout)["ok"] is False
        nobody = await run_cli("ctl", "no-such-worker", "health", *common, "--timeout", "2")
        assert nobody.returncode == 1 and "no answer from worker" in nobody.stderr
        bad = await run_cli("ctl", worker, "lora_load", "name", *common)
        assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr
    finally:
        fleet.stop()
