"""The pure half of ``jetfleet profile`` (the driver is ``infra/profile.py``): its settings, the
sweep points, and how a point and a capacity are computed from request timings. No I/O."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from itertools import pairwise
from typing import Any, Literal

from planner.capacity import CapacityProfile
from planner.config import PlannerConfig
from planner.observe import percentile
from router.fleet_state import FleetState, WorkerView
from schemas import WorkerRegistration

_PLANNER = PlannerConfig()
Phase = Literal["prefill", "decode"]
PointCallback = Callable[[str, "SweepPoint"], None]


class ProfileError(RuntimeError):
    """The profile cannot be measured (no such worker, failed requests, no step within target)."""


@dataclass(frozen=True)
class ProfileConfig:
    ttft_target_s: float = _PLANNER.ttft_target_s
    """p90 TTFT a prefill step must stay within (the planner's target)."""
    itl_target_s: float = _PLANNER.itl_target_s
    """Mean ITL a decode step must stay within (the planner's target)."""
    prefill_isl_tokens: int = 2048
    """Prompt tokens of the prefill sweep's requests (``mocker_profile``'s reference length)."""
    decode_isl_tokens: int = 256
    """Prompt tokens of the decode sweep's requests."""
    decode_osl_tokens: int = 256
    """Output tokens of the decode sweep's requests (the first of a new slot asks fewer)."""
    start_concurrency: int = 1
    """Concurrency of the first step."""
    step_factor: float = 2.0
    """Each step's concurrency is the last one times this (> 1)."""
    max_concurrency: int = 0
    """Highest step (0: the worker's ``max_num_seqs``)."""
    step_duration_s: float = 5.0
    """Measured window of one step, after its warm-up."""
    prefill_min_requests: int = 20
    """A prefill window lasts until at least this many requests were sent in it."""
    request_timeout_s: float = 60.0
    """A request without a chunk for this long, or a warm-up or wait this long, fails the run."""
    wait_for_worker_s: float = 5.0
    """How long to wait for the worker (and its model card) to show up in discovery."""
    interpolate: bool = True
    """Interpolate between the last step within target and the first one over it."""
    seed: int | None = None
    """Seed of the prompt generator (None: fresh prompts every run, no cache hits across runs)."""

    def __post_init__(self) -> None:
        if self.ttft_target_s <= 0 or self.itl_target_s <= 0 or self.step_duration_s <= 0:
            raise ValueError("latency targets and step duration must be positive")
        if self.prefill_isl_tokens < 1 or self.decode_isl_tokens < 1:
            raise ValueError("prompt lengths must be at least 1 token")
        if self.decode_osl_tokens < 2:
            raise ValueError("decode_osl_tokens must be at least 2 (ITL needs two tokens)")
        if self.start_concurrency < 1 or self.step_factor <= 1.0 or self.max_concurrency < 0:
            raise ValueError("need start_concurrency >= 1, step_factor > 1, max_concurrency >= 0")
        if self.request_timeout_s <= 0 or self.wait_for_worker_s < 0:
            raise ValueError("request_timeout_s must be positive, wait_for_worker_s >= 0")


@dataclass(slots=True)
class RequestTiming:
    """What the client saw of one request (``time.monotonic`` seconds)."""

    submitted_s: float
    prompt_tokens: int
    first_token_s: float = 0.0
    finished_s: float = 0.0
    cached_tokens: int = 0
    chunks: list[tuple[float, int]] = field(default_factory=list)
    """(arrival, tokens) of every chunk that carried tokens, in order."""
    error: str = ""

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.submitted_s if self.first_token_s else 0.0


@dataclass(frozen=True)
class SweepPoint:
    concurrency: int
    """Requests kept in flight."""
    window_s: float
    """Length of the measured window."""
    tokens_per_s: float
    """Prefill: uncached prompt tokens/s. Decode: output tokens/s."""
    latency_s: float
    """The latency held against the target. Prefill: p90 TTFT. Decode: mean ITL."""
    requests: int
    """Prefill: requests sent in the window. Decode: requests finished in it."""
    p50_ttft_s: float
    p90_ttft_s: float
    """TTFT percentiles of the requests sent in the window that got a first token."""
    cached_tokens: int
    """Prompt tokens of those requests served from the prefix cache (expect 0)."""


@dataclass(frozen=True)
class PhaseCapacity:
    tokens_per_s: float
    limited_by: Literal["target", "max_concurrency"]
    """``target``: a step went over target; ``max_concurrency``: the sweep ran out of steps."""
    last_good_concurrency: int
    first_bad_concurrency: int
    """0 when no step went over target."""


# ----------------------------------------------------------------------------- pure core


def geometric_steps(start: int, factor: float, maximum: int) -> tuple[int, ...]:
    """``start, start*factor, ...`` rounded and strictly increasing, below ``maximum``, then it."""
    if start < 1 or factor <= 1.0 or maximum < 1:
        raise ValueError("need start >= 1, factor > 1, maximum >= 1")
    steps: list[int] = []
    level = float(start)
    while True:
        n = max(round(level), steps[-1] + 1 if steps else 1)
        if n >= maximum:
            break
        steps.append(n)
        level *= factor
    return (*steps, maximum)


def stagger(max_tokens: int, new_slots: int) -> list[int]:
    """``max_tokens`` of the first request of each of ``new_slots`` slots joining a batch."""
    return [max(1, math.ceil(max_tokens * (k + 1) / new_slots)) for k in range(new_slots)]


def _answered(timings: Sequence[RequestTiming], t0: float, t1: float) -> list[RequestTiming]:
    """The requests sent in ``[t0, t1)`` that got a first token."""
    return [r for r in timings if t0 <= r.submitted_s < t1 and r.first_token_s]


def prefill_point(
    timings: Sequence[RequestTiming], concurrency: int, t0: float, t1: float
) -> SweepPoint:
    """One prefill step from its requests' timings and its window ``[t0, t1)``."""
    sent = _answered(timings, t0, t1)
    ttfts = [r.ttft_s for r in sent]
    uncached = sum(r.prompt_tokens - r.cached_tokens for r in timings if t0 <= r.first_token_s < t1)
    window = t1 - t0
    return SweepPoint(
        concurrency=concurrency,
        window_s=window,
        tokens_per_s=uncached / window if window > 0 else 0.0,
        latency_s=percentile(ttfts, 90.0),
        requests=sum(1 for r in timings if t0 <= r.submitted_s < t1),
        p50_ttft_s=percentile(ttfts, 50.0),
        p90_ttft_s=percentile(ttfts, 90.0),
        cached_tokens=sum(r.cached_tokens for r in sent),
    )


def decode_point(
    timings: Sequence[RequestTiming], concurrency: int, t0: float, t1: float
) -> SweepPoint:
    """One decode step from its requests' timings and its window ``[t0, t1)``."""
    tokens = gap_tokens = 0
    gaps_s = 0.0
    for r in timings:
        if r.finished_s and r.finished_s < t0:
            continue
        for at, n in r.chunks:
            if t0 <= at < t1:
                tokens += n
        for (before, _), (at, n) in pairwise(r.chunks):
            if t0 <= at < t1:
                gaps_s += at - before
                gap_tokens += n
    sent = _answered(timings, t0, t1)
    ttfts = [r.ttft_s for r in sent]
    window = t1 - t0
    return SweepPoint(
        concurrency=concurrency,
        window_s=window,
        tokens_per_s=tokens / window if window > 0 else 0.0,
        latency_s=gaps_s / gap_tokens if gap_tokens else 0.0,
        requests=sum(1 for r in timings if t0 <= r.finished_s < t1),
        p50_ttft_s=percentile(ttfts, 50.0),
        p90_ttft_s=percentile(ttfts, 90.0),
        cached_tokens=sum(r.cached_tokens for r in sent),
    )


def over_target(point: SweepPoint, target_s: float) -> bool:
    return point.latency_s > target_s


def pick_capacity(
    points: Sequence[SweepPoint], target_s: float, phase: str, interpolate: bool = True
) -> PhaseCapacity:
    """The capacity of one sweep (module docstring); ``ProfileError`` if no step was within."""
    good: list[SweepPoint] = []
    bad: SweepPoint | None = None
    for point in points:
        if over_target(point, target_s):
            bad = point
            break
        good.append(point)
    if not good:
        first = f" (concurrency {bad.concurrency}: {bad.latency_s:.4f} s)" if bad else ""
        raise ProfileError(
            f"no {phase} step met the {target_s} s latency target{first}; try a looser target "
            "or shorter prompts"
        )
    best = max(p.tokens_per_s for p in good)
    last = good[-1]
    if interpolate and bad is not None and bad.tokens_per_s > last.tokens_per_s:
        share = (target_s - last.latency_s) / (bad.latency_s - last.latency_s)
        best = max(best, last.tokens_per_s + share * (bad.tokens_per_s - last.tokens_per_s))
    if best <= 0:
        raise ProfileError(f"the {phase} sweep measured no throughput")
    return PhaseCapacity(
        tokens_per_s=best,
        limited_by="target" if bad is not None else "max_concurrency",
        last_good_concurrency=last.concurrency,
        first_bad_concurrency=bad.concurrency if bad is not None else 0,
    )


def select_worker(state: FleetState, worker_id: str | None, model: str | None) -> WorkerView:
    """The worker to profile: ``worker_id``, else the first live worker (by id) of ``model``."""
    ready = sorted(
        (v for v in state.workers.values() if v.reg.status == "ready"), key=lambda v: v.worker_id
    )
    names = ", ".join(f"{v.worker_id} ({v.reg.model})" for v in ready) or "none"
    if worker_id:
        view = state.workers.get(worker_id)
        if view is None:
            raise ProfileError(f"worker {worker_id!r} is not live; live workers: {names}")
        if view.reg.status != "ready":
            raise ProfileError(f"worker {worker_id!r} is {view.reg.status}, not ready")
        if model and view.reg.model != model:
            raise ProfileError(f"worker {worker_id!r} serves {view.reg.model!r}, not {model!r}")
        return view
    cands = [v for v in ready if model is None or v.reg.model == model]
    if not cands:
        raise ProfileError(f"no live worker serves {model or 'any model'}; live workers: {names}")
    if model is None and len({v.reg.model for v in cands}) > 1:
        raise ProfileError(f"several models are served, choose --model or --worker-id: {names}")
    return cands[0]


@dataclass(frozen=True)
class ProfileResult:
    profile: CapacityProfile
    worker: WorkerRegistration
    config: ProfileConfig
    prefill: PhaseCapacity
    decode: PhaseCapacity
    prefill_points: tuple[SweepPoint, ...]
    decode_points: tuple[SweepPoint, ...]

    def to_dict(self) -> dict[str, Any]:
        w = self.worker
        return {
            "profile": self.profile.to_dict(),
            "worker": {
                "worker_id": w.worker_id,
                "model": w.model,
                "role": w.role,
                "engine": w.engine,
                "max_num_seqs": w.max_num_seqs,
                "num_gpu_blocks": w.num_gpu_blocks,
                "block_size": w.block_size,
            },
            "config": asdict(self.config),
            "prefill": _phase_dict(self.prefill, self.config.ttft_target_s, self.prefill_points),
            "decode": _phase_dict(self.decode, self.config.itl_target_s, self.decode_points),
        }


def _rounded(item: SweepPoint | PhaseCapacity) -> dict[str, Any]:
    return {k: round(v, 5) if isinstance(v, float) else v for k, v in asdict(item).items()}


def _phase_dict(cap: PhaseCapacity, target_s: float, points: Sequence[SweepPoint]) -> Any:
    return _rounded(cap) | {"target_s": target_s, "points": [_rounded(p) for p in points]}


def describe(reg: WorkerRegistration, cfg: ProfileConfig, when: datetime) -> str:
    return (
        f"measured by jetfleet profile on {when:%Y-%m-%d %H:%M} UTC against worker "
        f"{reg.worker_id} (engine {reg.engine}, model {reg.model}, role {reg.role}, "
        f"max_num_seqs {reg.max_num_seqs}, {reg.num_gpu_blocks} KV blocks of {reg.block_size}); "
        f"prefill isl {cfg.prefill_isl_tokens} at p90 TTFT <= {cfg.ttft_target_s} s, decode "
        f"isl {cfg.decode_isl_tokens} osl {cfg.decode_osl_tokens} at mean ITL <= "
        f"{cfg.itl_target_s} s"
    )


# ----------------------------------------------------------------------------- load (I/O)
