"""A finished request's ``RequestObservation``, the one builder for every kind of generation.

What the planner and the replay tools learn about a request: sizes, cache hits, where it ran and
why, and its latencies from the monotonic times the caller saw: accepted, first token, last token
(0.0: never). TTFT = first - accepted; ITL = (last - first) / (OSL - 1), the mean gap between
the tokens after the first; e2e = last (or now) - accepted.
"""

from __future__ import annotations

import time
from typing import Protocol

from schemas import Request, RequestObservation, RouteDecision


class Observed(Protocol):
    """What a generation (plain or disaggregated) exposes to be observed."""

    @property
    def request(self) -> Request: ...
    @property
    def worker_id(self) -> str: ...
    @property
    def prompt_len(self) -> int: ...
    @property
    def generated(self) -> list[int]: ...
    @property
    def cached_tokens(self) -> int: ...
    @property
    def host_cached_tokens(self) -> int: ...
    @property
    def attempts(self) -> int: ...
    @property
    def decision(self) -> RouteDecision | None: ...
    @property
    def disagg(self) -> str: ...
    @property
    def disagg_reason(self) -> str: ...
    @property
    def prefill_worker_id(self) -> str: ...  # a remote prefill's worker ("" : none)
    @property
    def prefill_s(self) -> float: ...  # accepted to the remote prefill's answer
    @property
    def kv_transfer_ms(self) -> float: ...  # the remote prefill's KV pulled into the decoder


def observation(
    gen: Observed,
    *,
    status: str,
    accepted: float,
    first_at: float,
    last_at: float,
    source: str,
    finish_reason: str | None = None,
    error: str | None = None,
) -> RequestObservation:
    """``gen``'s observation; ``source``: the frontend (or service) that followed it."""
    osl = len(gen.generated)
    end = last_at or time.monotonic()
    return RequestObservation(
        request_id=gen.request.request_id,
        model=gen.request.model,
        status=status,
        ts_s=time.time(),
        worker_id=gen.worker_id,
        isl_tokens=gen.prompt_len,
        osl_tokens=osl,
        cached_tokens=gen.cached_tokens,
        host_cached_tokens=gen.host_cached_tokens,
        ttft_s=(first_at - accepted) if first_at else 0.0,
        itl_s=(last_at - first_at) / (osl - 1) if osl > 1 and first_at and last_at else 0.0,
        e2e_s=end - accepted,
        attempts=gen.attempts,
        finish_reason=finish_reason,
        error=error,
        route=gen.decision,
        frontend_id=source,
        disagg=gen.disagg,
        disagg_reason=gen.disagg_reason,
        prefill_worker_id=gen.prefill_worker_id,
        prefill_s=gen.prefill_s,
        kv_transfer_ms=gen.kv_transfer_ms,
    )
