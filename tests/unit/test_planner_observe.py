"""Folding wire messages into an IntervalObservation."""

from __future__ import annotations

import pytest

from planner.observe import percentile, summarize
from schemas.metrics import HeldRequests, RequestObservation, WorkerLoad


def req(i: int, status: str = "ok", ttft_s: float = 0.1) -> RequestObservation:
    return RequestObservation(
        request_id=f"r{i}",
        model="m",
        status=status,
        ts_s=100.0 + i,
        isl_tokens=1000,
        osl_tokens=100,
        cached_tokens=200,
        ttft_s=ttft_s,
        itl_s=0.02,
    )


def load(worker: str, role: str, ts_s: float, waiting: int, kv: float) -> WorkerLoad:
    return WorkerLoad(
        worker_id=worker,
        model="m",
        role=role,
        ts_s=ts_s,
        num_running=1,
        num_waiting=waiting,
        max_num_seqs=256,
        kv_usage=kv,
        num_gpu_blocks=100,
    )


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [([], 90.0, 0.0), ([3.0], 50.0, 3.0), ([float(i) for i in range(1, 11)], 90.0, 9.0)],
)
def test_percentile(values: list[float], q: float, expected: float):
    assert percentile(values, q) == expected


def test_summarize():
    requests = [req(i, ttft_s=0.1 * (i + 1)) for i in range(10)] + [req(99, status="shed")]
    loads = [
        load("w1", "agg", 1.0, 10, 0.9),
        load("w1", "agg", 2.0, 4, 0.5),  # newest of w1 wins
        load("w2", "agg", 1.5, 2, 0.3),
        load("p1", "prefill", 1.0, 7, 0.1),
    ]
    o = summarize(120.0, requests, loads)
    assert o.num_requests == 11
    assert (o.mean_isl, o.mean_osl, o.mean_cached_tokens) == (1000.0, 100.0, 200.0)
    assert o.p50_ttft_s == pytest.approx(0.5) and o.p90_ttft_s == pytest.approx(0.9)
    assert o.itl_s == pytest.approx(0.02)
    assert o.replicas == {"agg": 2, "prefill": 1}
    assert o.total_waiting == {"agg": 6, "prefill": 7}
    assert o.mean_kv_usage["agg"] == pytest.approx(0.4)
    assert summarize(120.0, [], [], replicas={"agg": 3}).replicas == {"agg": 3}


def test_requests_frontends_hold_wait_with_the_workers_waiting():
    """Held in a frontend while every worker has a queue, they are in no worker's report; the
    planner must see them or it sizes for the queue the workers show (8 each), not the one
    there is."""
    loads = [load("w1", "agg", 1.0, 8, 0.9), load("w2", "agg", 1.0, 8, 0.9)]
    held = [
        HeldRequests("f1", "m", 1.0, {"agg": 30}),
        HeldRequests("f1", "m", 2.0, {"agg": 25}),  # the newest of f1 counts
        HeldRequests("f2", "m", 1.5, {"agg": 5, "decode": 3}),
        HeldRequests("f3", "m", 1.2, {}),  # holds none any more
    ]
    o = summarize(120.0, [], loads, held=held)
    assert o.total_waiting == {"agg": 16 + 25 + 5, "decode": 3}
    assert o.replicas == {"agg": 2}  # a frontend is no replica
