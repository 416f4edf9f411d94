"""``jetfleet profile`` against a real mocker worker process on a real nats-server.

The mocker at ``speedup`` s runs its timing model s times faster; with the latency targets divided
by s too it behaves like the mocker at speedup 1 against the planner's targets, so the measured
profile should be near ``mocker_profile(max_num_seqs=N).scaled(s)``, the profile derived from the
timing model (with its 0.8 headroom) for a batch of N sequences filling 80% of the KV pool. The
worker is sized to match: ``--max-num-seqs`` N and a pool the decode sweep's top batch fills to
about 80%. ``s`` and N stay small: a faster or bigger mocker is bound by this machine's CPU (the
Python worker and client), not by its timing model, and measures accordingly less.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from base.topology import ensure_topology
from infra.cli import build_parser
from infra.profile import run_profile
from planner.capacity import load_profile, mocker_profile
from schemas import Subjects
from tests.support.fleet import Fleet

pytestmark = pytest.mark.integration

SPEEDUP = 5.0
MAX_NUM_SEQS = 32
DECODE_ISL, DECODE_OSL = 128, 64
# blocks of a decode request over its life: 8 of prompt, ~2 of output on average, ~1 partial
KV_BLOCKS = round(MAX_NUM_SEQS * 11 / 0.8)


@pytest.fixture
def worker_fleet(nats_url: str, fleet_prefix: str, tmp_path: Path) -> Iterator[Fleet]:
    fleet = Fleet(nats_url, tmp_path / "logs", prefix=fleet_prefix, worker_args=())
    try:
        yield fleet
    finally:
        fleet.stop()


def profile_args(nats_url: str, prefix: str, *extra: str) -> list[str]:
    return ["profile", "--nats", nats_url, "--subject-prefix", prefix, *extra]


async def run_cli(argv: list[str], subjects: Subjects) -> int:
    args = build_parser().parse_args(argv)
    return await asyncio.to_thread(run_profile, args, subjects)


async def test_measures_a_mocker_worker_near_its_timing_model(
    worker_fleet, nc, subjects, nats_url, tmp_path, capsys
):
    await ensure_topology(nc.jetstream(), subjects)
    worker_id = worker_fleet.add_worker(
        "--speedup",
        str(SPEEDUP),
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--num-gpu-blocks",
        str(KV_BLOCKS),
    )
    out = tmp_path / "profile.json"
    argv = profile_args(
        nats_url,
        subjects.prefix,
        "--worker-id",
        worker_id,
        "--out",
        str(out),
        "--ttft-target",
        str(0.5 / SPEEDUP),
        "--itl-target",
        str(0.05 / SPEEDUP),
        "--duration",
        "0.5",
        "--min-requests",
        "10",
        "--osl",
        str(DECODE_OSL),
        "--decode-isl",
        str(DECODE_ISL),
        "--timeout",
        "20",
        "--wait",
        "30",  # the worker process is still starting: the profile waits for it to register
    )
    assert await run_cli(argv, subjects) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out[captured.out.index("{\n") :])  # after any log lines

    measured = load_profile(out)
    assert report["profile"] == measured.to_dict()
    assert f"worker {worker_id} (engine mocker" in measured.description
    model = mocker_profile(max_num_seqs=MAX_NUM_SEQS).scaled(SPEEDUP)
    ratios = (
        measured.prefill_tokens_per_s / model.prefill_tokens_per_s,
        measured.decode_tokens_per_s / model.decode_tokens_per_s,
    )
    assert all(0.3 < r < 3.0 for r in ratios), (ratios, captured.err)
    for phase in (report["prefill"], report["decode"]):
        points, target_s = phase["points"], phase["target_s"]
        assert [p["concurrency"] for p in points] == [1, 2, 4, 8, 16, 32][: len(points)]
        assert all(p["cached_tokens"] == 0 for p in points), "prompts hit the prefix cache"
        assert all(p["latency_s"] <= target_s for p in points[:-1]), "ran past a missed target"
        if phase["limited_by"] == "target":
            assert points[-1]["latency_s"] > target_s
        else:
            assert points[-1]["concurrency"] == MAX_NUM_SEQS
            assert points[-1]["latency_s"] <= target_s
    # prefill saturates with a few requests in flight: TTFT passes its target long before 32
    assert report["prefill"]["limited_by"] == "target"


async def test_unknown_worker_is_a_clear_error(nc, subjects, nats_url, tmp_path, capsys):
    await ensure_topology(nc.jetstream(), subjects)
    out = tmp_path / "profile.json"
    argv = profile_args(
        nats_url, subjects.prefix, "--worker-id", "w-nobody", "--wait", "0", "--out", str(out)
    )
    assert await run_cli(argv, subjects) == 1
    err = capsys.readouterr().err
    assert "worker 'w-nobody' is not live" in err
    assert not out.exists()


async def test_a_fleet_that_was_never_set_up_is_a_clear_error(subjects, nats_url, capsys):
    argv = profile_args(nats_url, subjects.prefix, "--wait", "0")
    assert await run_cli(argv, subjects) == 1
    assert f"no fleet with prefix {subjects.prefix!r}" in capsys.readouterr().err
