"""Disaggregated serving: where each request's prefill runs. Pure.

A fleet with ``decode`` workers serves a request in two phases when that pays: a ``prefill``
worker computes the prompt (``max_tokens=1``, ``kv_transfer_params={"do_remote_decode": true}``)
and keeps its KV; the decode worker the router chose pulls that KV and generates the rest.
Otherwise the request is prefilled locally (see ``local_on_prefill_workers`` below for where).
The choice is made per request, from the decode worker's own view of the prompt (the part it has
not cached) and the prefill pool's load:

============  =====================================================================
never         always local
always        always remote (when a prefill worker exists)
isl           remote when the uncached part is at least ``isl_threshold`` tokens
load          remote unless every prefill worker holds ``prefill_queue_limit`` requests
isl_or_load   remote when the uncached part is long and the prefill pool is not saturated
============  =====================================================================

Every decision carries its reason (``RequestObservation.disagg_reason``).

With ``local_on_prefill_workers`` (the default) a request that will be prefilled locally
wherever it lands (a whole prompt shorter than ``isl_threshold``, or the policy ``never``) is
routed over both pools, and runs start to end on whichever worker is best, a prefill worker
included, as on an aggregated fleet: a fixed split whose traffic turns short and cached leaves
no pool idle. A longer prompt is routed over the decode workers and placed as above; a saturated
prefill pool or a failed prefill never lands a whole request on a prefill worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Policy = Literal["never", "always", "isl", "load", "isl_or_load"]
POLICIES: tuple[str, ...] = ("never", "always", "isl", "load", "isl_or_load")


@dataclass(frozen=True)
class DisaggConfig:
    policy: Policy = "isl_or_load"
    """How each request's prefill is placed (see router/disagg.py)."""
    isl_threshold: int = 2048
    """A prompt whose part the decode worker has not cached is at least this long goes remote;
    a whole prompt shorter than this is routed over both pools (``local_on_prefill_workers``)."""
    prefill_queue_limit: int = 4
    """The prefill pool is saturated when every prefill worker holds this many prefills (remote
    prefills in flight, or requests it reports waiting; not the whole requests it decodes)."""
    prefill_timeout_s: float = 30.0
    """A remote prefill that gives no answer for this long is abandoned: the decode worker
    prefills itself."""
    local_on_prefill_workers: bool = True
    """A request prefilled locally may run, start to end, on a prefill worker too (routed over
    both pools): a fixed split whose traffic turns short and cached leaves no pool idle."""

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"disagg policy must be one of {', '.join(POLICIES)}")
        if self.isl_threshold < 0 or self.prefill_queue_limit < 1 or self.prefill_timeout_s <= 0:
            raise ValueError("isl_threshold >= 0, prefill_queue_limit >= 1, timeout > 0")


@dataclass(frozen=True)
class Placement:
    remote: bool
    reason: str  # why: "policy_never", "no_prefill_workers", "short_uncached", ...


def uncached_tokens(prompt_len: int, overlap_blocks: int, block_size: int) -> int:
    """What the decode worker would have to compute itself."""
    return max(prompt_len - overlap_blocks * block_size, 0)


def saturated(queued: Sequence[int], limit: int) -> bool:
    """Every prefill worker (its requests as best known) at the limit or past it."""
    return bool(queued) and all(q >= limit for q in queued)


def routes_over_both_pools(cfg: DisaggConfig, prompt_len: int) -> bool:
    """Whether a request is first routed over prefill and decode workers alike: when it will be
    prefilled locally wherever it lands (never disaggregated, or a whole prompt shorter than the
    threshold). A longer prompt is routed over the decode pool first, as without the option."""
    if not cfg.local_on_prefill_workers:
        return False
    if cfg.policy == "never":
        return True
    return cfg.policy in ("isl", "isl_or_load") and prompt_len < cfg.isl_threshold


def stays_on_prefill_worker(placement: Placement) -> bool:
    """A request routed to a prefill worker runs there whole only when it is prefilled locally
    by choice (short, never disaggregated, or no prefill at all: an embedding, prompt embeds),
    not for a saturated pool or a failed prefill."""
    return not placement.remote and placement.reason in (
        "short_uncached",
        "policy_never",
        "not_a_prefill",
    )


def place(cfg: DisaggConfig, uncached: int, prefill_queued: Sequence[int]) -> Placement:
    """Remote or local prefill for a prompt the decode worker lacks ``uncached`` tokens of;
    ``prefill_queued``: each live prefill worker's requests."""
    if cfg.policy == "never":
        return Placement(False, "policy_never")
    if not prefill_queued:
        return Placement(False, "no_prefill_workers")
    if cfg.policy == "always":
        return Placement(True, "policy_always")
    short = uncached < cfg.isl_threshold
    full = saturated(prefill_queued, cfg.prefill_queue_limit)
    if cfg.policy in ("isl", "isl_or_load") and short:
        return Placement(False, "short_uncached")
    if cfg.policy in ("load", "isl_or_load") and full:
        return Placement(False, "prefill_saturated")
    return Placement(True, "long_uncached" if cfg.policy != "load" else "prefill_free")


def plan(
    cfg: DisaggConfig,
    prompt_len: int,
    prefills: bool,
    overlap_blocks: int,
    block_size: int,
    prefill_queued: Sequence[int],
) -> Placement:
    """Where a request routed to a decode worker (``overlap_blocks`` of its prompt cached there,
    blocks of ``block_size``) is prefilled: ``prefills`` is False for a request with nothing to
    prefill (an embedding, prompt embeddings), which stays local."""
    if not prefills:
        return Placement(False, "not_a_prefill")
    return place(cfg, uncached_tokens(prompt_len, overlap_blocks, block_size), prefill_queued)
