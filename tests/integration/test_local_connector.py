"""The local connector against real worker processes and a real nats-server: a decision up starts
workers that register, a decision down drains the newest, and ``close`` stops every worker it
started (before it returns: nothing is left for PID 1 to adopt). Given cores, each worker it starts
runs on the slice fewest of its workers run on, and a slice a drained worker left is taken again."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from base.topology import ensure_topology
from base.worker_watch import WorkerWatch
from infra.command import cli_command
from planner.connectors.local import LocalScaler, LocalScalerConfig
from schemas import ScalingDecided, Subjects
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


def decided(current: int, desired: int) -> ScalingDecided:
    return ScalingDecided("jetfleet-tiny", "agg", 1, time.time(), current, desired)


def cores_of(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return argv[argv.index("--cpu-cores") + 1]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_up_down_and_close_stop_the_workers_it_started(
    nc, nats_url: str, subjects: Subjects, fleet_prefix: str, tmp_path: Path
) -> None:
    await ensure_topology(nc.jetstream(), subjects)
    watch = WorkerWatch(nc, subjects)
    await watch.start()
    cfg = LocalScalerConfig(
        nats_url=nats_url,
        worker_command=tuple(cli_command("worker")),
        subject_prefix=fleet_prefix,
        log_dir=tmp_path,
        worker_args=("--speedup", "20"),
        id_prefix=fleet_prefix,
        cpu_sets=("0", "1"),  # (the mocker takes the flag and runs anywhere)
    )
    scaler = LocalScaler(cfg, watch)
    try:
        up = await scaler.scale(decided(0, 2))
        assert up.ok, up.detail
        pids = {c.name: c.proc.pid for c in scaler.group.children.values()}
        assert len(pids) == 2 and all(map(alive, pids.values()))
        assert {r.pid for r in watch.regs.values()} == set(pids.values())
        assert {n: cores_of(p) for n, p in pids.items()} == {"agg-0": "0", "agg-1": "1"}

        # decided while the second worker was still starting, applied after it registered: the
        # role already has 2, nothing more starts
        stale = await scaler.scale(decided(1, 2))
        assert stale.ok and "nothing to do" in stale.detail, stale.detail
        assert len(scaler.group.children) == 2

        down = await scaler.scale(decided(2, 1))
        assert down.ok and "exit 0" in down.detail, down.detail  # drained, not killed
        newest = max(pids)  # agg-1: the newest goes first
        assert not alive(pids[newest]) and alive(pids[min(pids)])
        await wait_for(lambda: len(watch.regs) == 1, timeout=10)  # it deregistered

        again = await scaler.scale(decided(1, 2))  # the newcomer takes the core agg-1 left
        assert again.ok, again.detail
        assert cores_of(scaler.group.children["agg-2"].proc.pid) == "1"
        pids["agg-2"] = scaler.group.children["agg-2"].proc.pid
    finally:
        await scaler.close()
    assert not any(map(alive, pids.values()))  # close returned: every worker it started is gone
    await wait_for(lambda: not watch.regs, timeout=10)
    await watch.stop()
