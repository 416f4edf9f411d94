"""Factory helpers for the mocker's pure-core tests (scheduler, block pool): no model metadata,
no servers. Small pools and budgets so a handful of requests exercise every path."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from schemas.kv_events import KvCacheEvent
from workers.engines.mocker.config import MockerConfig
from workers.engines.mocker.scheduler import (
    Scheduler,
    SeqRequest,
    StepResult,
    default_token_source,
)

BLOCK_SIZE = 4


def make_config(**overrides: object) -> MockerConfig:
    base: dict[str, object] = {
        "num_gpu_blocks": 64,
        "block_size": BLOCK_SIZE,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 64,
        "watermark": 0.0,
    }
    base.update(overrides)
    return MockerConfig(**base)  # type: ignore[arg-type]


def make_scheduler(**overrides: object) -> Scheduler:
    return Scheduler(make_config(**overrides))


def prompt(n: int, start: int = 1000) -> tuple[int, ...]:
    """``n`` distinct token ids starting at ``start`` (different ``start``: no shared prefix)."""
    return tuple(range(start, start + n))


def make_request(
    request_id: str,
    tokens: Sequence[int] | int,
    max_tokens: int = 4,
    seed: int | None = None,
    lora_name: str | None = None,
) -> SeqRequest:
    ids = prompt(tokens) if isinstance(tokens, int) else tuple(tokens)
    seed = zlib.crc32(request_id.encode()) if seed is None else seed
    return SeqRequest(request_id, ids, max_tokens, seed, lora_name)


def expected_tokens(req: SeqRequest) -> list[int]:
    return [default_token_source(req.seed, i) for i in range(req.max_tokens)]


@dataclass
class Run:
    """Everything a scripted loop observed."""

    steps: list[StepResult] = field(default_factory=list)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    finish: dict[str, str | None] = field(default_factory=dict)
    cached: dict[str, int] = field(default_factory=dict)
    events: list[KvCacheEvent] = field(default_factory=list)


def run_until_idle(sched: Scheduler, max_steps: int = 10_000, run: Run | None = None) -> Run:
    """Step until no work is left; collect outputs and KV events."""
    run = run or Run()
    for _ in range(max_steps):
        if not sched.has_work:
            return run
        record_step(sched, run)
    raise AssertionError(f"scheduler still busy after {max_steps} steps")


def add_and_run(sched: Scheduler, *reqs: SeqRequest) -> Run:
    for req in reqs:
        sched.add_request(req)
    return run_until_idle(sched)


def record_step(sched: Scheduler, run: Run) -> StepResult:
    result = sched.step()
    run.steps.append(result)
    for out in result.outputs:
        run.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        run.cached[out.request_id] = out.num_cached_tokens
        if out.finished:
            run.finish[out.request_id] = out.finish_reason
    run.events.extend(sched.take_events())
    return result
