"""Fold one interval's wire messages into the planner's ``IntervalObservation``.

Pure: the service (live) and replay (recorded) collect the interval's ``RequestObservation``
messages (fleet.obs.{model}) and ``WorkerLoad`` reports (fleet.metrics.{model}.{role}.{worker})
and call ``summarize``. How each field is made:

- ``num_requests``: every finished request, whatever its status (shed and failed requests are
  demand too); lengths and latencies come from ``status == "ok"`` requests only;
- ``mean_isl``/``mean_osl``/``mean_cached_tokens``: means over the ok requests;
- ``p50_ttft_s``/``p90_ttft_s``: nearest-rank percentiles of the ok requests' TTFT (> 0);
- ``itl_s``: mean ITL of the ok requests that report one (> 0);
- per role, from the newest report of each worker: ``total_waiting`` sums ``num_waiting``,
  ``mean_kv_usage`` averages ``kv_usage``; ``replicas`` counts the workers unless the caller
  passes the counts it knows from discovery (preferred: a silent worker still costs a GPU);
  ``unmanaged``: how many of them were started by hand (discovery's ``managed_by`` empty).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

from planner.config import IntervalObservation
from schemas.metrics import HeldRequests, RequestObservation, WorkerLoad

_R = TypeVar("_R", WorkerLoad, HeldRequests)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0..100) of ``values``; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarize(
    ts_s: float,
    observations: Iterable[RequestObservation],
    loads: Iterable[WorkerLoad],
    replicas: Mapping[str, int] | None = None,
    unmanaged: Mapping[str, int] | None = None,
    held: Iterable[HeldRequests] = (),
) -> IntervalObservation:
    """The interval ending at ``ts_s``, from its request observations and worker reports. The
    requests frontends hold (each frontend's last report of the interval; one that reported
    none held none) wait as the workers' waiting do, and count with them."""
    finished = list(observations)
    ok = [o for o in finished if o.status == "ok"]
    ttfts = [o.ttft_s for o in ok if o.ttft_s > 0.0]
    newest = _newest(loads, lambda load: load.worker_id)
    by_role: dict[str, list[WorkerLoad]] = {}
    for worker_id in sorted(newest):
        load = newest[worker_id]
        by_role.setdefault(load.role, []).append(load)
    counts = dict(replicas) if replicas is not None else {r: len(w) for r, w in by_role.items()}
    return IntervalObservation(
        ts_s=ts_s,
        num_requests=len(finished),
        mean_isl=_mean([float(o.isl_tokens) for o in ok]),
        mean_osl=_mean([float(o.osl_tokens) for o in ok]),
        p50_ttft_s=percentile(ttfts, 50.0),
        p90_ttft_s=percentile(ttfts, 90.0),
        itl_s=_mean([o.itl_s for o in ok if o.itl_s > 0.0]),
        mean_cached_tokens=_mean([float(o.cached_tokens) for o in ok]),
        replicas=counts,
        unmanaged={r: n for r, n in (unmanaged or {}).items() if n},
        total_waiting=_waiting(by_role, held),
        total_running={r: sum(w.num_running for w in ws) for r, ws in by_role.items()},
        # over every worker of the role: an idle worker reports once, then nothing
        mean_kv_usage={
            r: sum(w.kv_usage for w in ws) / max(counts.get(r, 0), len(ws), 1)
            for r, ws in by_role.items()
        },
    )


def _waiting(
    by_role: Mapping[str, list[WorkerLoad]], held: Iterable[HeldRequests]
) -> dict[str, int]:
    waiting = {r: sum(w.num_waiting for w in ws) for r, ws in by_role.items()}
    for h in _newest(held, lambda h: h.frontend_id).values():
        for role, n in h.held.items():
            if n > 0:
                waiting[role] = waiting.get(role, 0) + n
    return waiting


def _newest(reports: Iterable[_R], by: Callable[[_R], str]) -> dict[str, _R]:
    """Each sender's latest report (``ts_s``; the later of two with the same)."""
    newest: dict[str, _R] = {}
    for report in reports:
        seen = newest.get(by(report))
        if seen is None or report.ts_s >= seen.ts_s:
            newest[by(report)] = report
    return newest
