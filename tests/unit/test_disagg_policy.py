"""Where a prefill runs (router/disagg.py): every policy, every reason, the thresholds' edges."""

from __future__ import annotations

import pytest

from router.disagg import (
    DisaggConfig,
    Placement,
    place,
    plan,
    routes_over_both_pools,
    saturated,
    stays_on_prefill_worker,
    uncached_tokens,
)


@pytest.mark.parametrize(
    ("policy", "uncached", "queued", "expected"),
    [
        ("never", 9000, [0], Placement(False, "policy_never")),
        ("always", 10, [], Placement(False, "no_prefill_workers")),
        ("always", 10, [9, 9], Placement(True, "policy_always")),
        ("isl", 2047, [0], Placement(False, "short_uncached")),
        ("isl", 2048, [9], Placement(True, "long_uncached")),
        ("load", 10, [4, 3], Placement(True, "prefill_free")),
        ("load", 9000, [4, 4], Placement(False, "prefill_saturated")),
        ("isl_or_load", 2047, [0], Placement(False, "short_uncached")),
        ("isl_or_load", 2048, [4, 5], Placement(False, "prefill_saturated")),
        ("isl_or_load", 2048, [3, 5], Placement(True, "long_uncached")),
        ("isl_or_load", 5000, [], Placement(False, "no_prefill_workers")),
    ],
)
def test_placement(policy: str, uncached: int, queued: list[int], expected: Placement) -> None:
    cfg = DisaggConfig(policy=policy, isl_threshold=2048, prefill_queue_limit=4)  # type: ignore[arg-type]
    assert place(cfg, uncached, queued) == expected


@pytest.mark.parametrize(
    ("placement", "stays"),
    [
        (Placement(False, "short_uncached"), True),
        (Placement(False, "policy_never"), True),
        (Placement(False, "prefill_saturated"), False),  # long: not on a busy prefill worker
        (Placement(False, "prefill_unavailable"), False),
        (Placement(True, "long_uncached"), False),
        (Placement(True, "policy_always"), False),
    ],
)
def test_a_prefill_worker_runs_a_request_whole_only_when_it_is_short_by_choice(
    placement: Placement, stays: bool
) -> None:
    assert stays_on_prefill_worker(placement) is stays


@pytest.mark.parametrize(
    ("cfg", "prompt_len", "both"),
    [
        (DisaggConfig(), 2047, True),  # short anywhere: local wherever it lands
        (DisaggConfig(), 2048, False),  # may go remote: the decode pool first
        (DisaggConfig(policy="isl"), 100, True),
        (DisaggConfig(policy="never"), 90000, True),
        (DisaggConfig(policy="always"), 10, False),
        (DisaggConfig(policy="load"), 10, False),  # local only when the prefill pool is full
        (DisaggConfig(local_on_prefill_workers=False), 10, False),
    ],
)
def test_which_requests_are_routed_over_both_pools(
    cfg: DisaggConfig, prompt_len: int, both: bool
) -> None:
    assert routes_over_both_pools(cfg, prompt_len) is both


def test_helpers_and_validation() -> None:
    assert uncached_tokens(100, 3, 16) == 52 and uncached_tokens(40, 3, 16) == 0
    assert not saturated([], 1) and saturated([2, 2], 2) and not saturated([2, 1], 2)
    for bad in (
        {"policy": "sometimes"},
        {"isl_threshold": -1},
        {"prefill_queue_limit": 0},
        {"prefill_timeout_s": 0},
    ):
        with pytest.raises(ValueError):
            DisaggConfig(**bad)  # type: ignore[arg-type]


def test_replay_request_says_where_the_prefill_ran() -> None:
    from infra.replay_request import summarize_observation
    from schemas import RequestObservation

    remote = RequestObservation(
        "r1",
        "m",
        "ok",
        1.0,
        worker_id="d1",
        disagg="remote",
        disagg_reason="long_uncached",
        prefill_worker_id="p1",
        prefill_s=0.25,
        kv_transfer_ms=16.25,
    )
    text = summarize_observation(remote)
    assert "prefilled remotely (long_uncached) on p1 in 250.0 ms, KV pulled in 16.25 ms" in text
    assert "replay r1-prefill" in text
    local = RequestObservation("r2", "m", "ok", 1.0, disagg="local", disagg_reason="short_uncached")
    assert "prefilled locally (short_uncached)" in summarize_observation(local)
    assert "prefill" not in summarize_observation(RequestObservation("r3", "m", "ok", 1.0))


def test_replay_request_says_how_much_came_from_host_memory() -> None:
    from infra.replay_request import summarize_observation
    from schemas import RequestObservation

    tiered = RequestObservation("r1", "m", "ok", 1.0, cached_tokens=2048, host_cached_tokens=1536)
    assert "cached 2048 (1536 from host memory)" in summarize_observation(tiered)
    gpu = RequestObservation("r2", "m", "ok", 1.0, cached_tokens=64)
    assert "cached 64," in summarize_observation(gpu)
    assert "host" not in summarize_observation(gpu)


def test_the_plan_places_what_the_decode_worker_lacks_and_keeps_non_prefills_local() -> None:
    cfg = DisaggConfig(policy="isl", isl_threshold=2048)
    # 3,000 tokens, 64 blocks of 16 cached on the chosen decode worker: 1,976 left, short
    assert plan(cfg, 3000, True, 64, 16, [0]) == Placement(False, "short_uncached")
    assert plan(cfg, 3000, True, 59, 16, [0]) == Placement(True, "long_uncached")  # 2,056 left
    assert plan(cfg, 3000, False, 0, 16, [0]) == Placement(False, "not_a_prefill")
