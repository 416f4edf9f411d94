"""What a request costs a frontend's fleet state as the fleet grows: the two sums over its
candidates it asks for (room before shedding, ``FleetState.saturated``; room before holding,
``Holding.room``) and its count, kept between refreshes, beside the same sums taken afresh.

    python -m tests.bench.request_sums [--workers 16,256,1024,4096] [--calls 5000]

Every worker of one model reports a full queue (the sums then visit every term). ``kept_us``: a
request's two asks and its count, per request, over ``--calls`` requests in a row (the kept sums
refreshed once a ``SUM_REFRESH_S``, as the frontend's clock runs); ``afresh_us``: the same two
sums taken afresh (what every request paid before the sums were kept). One JSON document.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any, cast

from router.fleet_state import FleetState
from router.holding import LOAD_REPORT_MAX_AGE_S, Holding
from schemas import WorkerLoad, WorkerRegistration


def _per_call_us(fn: Callable[[], object], calls: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def measure(workers: int, calls: int) -> dict[str, Any]:
    state = FleetState()
    now = time.monotonic()
    for i in range(workers):
        state.upsert(WorkerRegistration(f"w{i}", "m", "agg", "mocker", 8, 100, 16))
        state.apply_load(WorkerLoad(f"w{i}", "m", "agg", 0.0, 8, 9, 4, 0.0, 100), now)
    holding = Holding(state, 8, cast(Any, None), cast(Any, None))  # no pump, no reports here
    key = ("m", ("agg",), None)
    sent = iter(range(10**9))

    def request() -> None:
        state.saturated("m", ("agg",), 64, None, 0, time.monotonic())
        holding.room(key)
        state.count(f"w{next(sent) % workers}", +1)

    def afresh() -> None:
        state.saturated("m", ("agg",), 64, None, 0)
        state.room("m", ("agg",), None, 8, time.monotonic() - LOAD_REPORT_MAX_AGE_S)

    return {
        "workers": workers,
        "kept_us": round(_per_call_us(request, calls), 1),
        "afresh_us": round(_per_call_us(afresh, max(calls // 20, 10)), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="16,256,1024,4096")
    ap.add_argument("--calls", type=int, default=5000)
    args = ap.parse_args()
    rows = [measure(int(n), args.calls) for n in args.workers.split(",")]
    print(json.dumps({"bench": "request_sums", "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
