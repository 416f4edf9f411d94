"""FleetState (pure): routing by LoRA adapter (only workers holding it are candidates), and each
worker's progress as its engine step count moves."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router import fleet_state as fleet_state_module
from router.fleet_state import SUM_REFRESH_S, FleetState
from schemas import WorkerLoad, WorkerRegistration


def reg(
    worker: str, loras: tuple[str, ...] = (), model: str = "m", status: str = "ready"
) -> WorkerRegistration:
    return WorkerRegistration(worker, model, "agg", "vllm", 8, 100, 32, status=status, loras=loras)  # type: ignore[arg-type]


def test_an_adapters_candidates_are_the_workers_holding_it() -> None:
    state = FleetState()
    for r in (
        reg("a", ("sql",)),
        reg("b"),
        reg("c", ("sql", "poet")),
        reg("d", ("sql",), status="draining"),
    ):
        state.upsert(r)
    assert {v.worker_id for v in state.candidates("m")} == {"a", "b", "c"}
    assert {v.worker_id for v in state.candidates("m", lora="sql")} == {"a", "c"}
    assert {v.worker_id for v in state.candidates("m", lora="poet")} == {"c"}
    assert state.candidates("m", lora="none-loaded") == []
    assert state.adapters() == {"sql": "m", "poet": "m"}  # a draining worker's do not count


def test_an_unloaded_adapter_leaves_the_candidates() -> None:
    state = FleetState()
    state.upsert(reg("a", ("sql",)))
    state.upsert(reg("a"))  # the registration republished after lora_unload
    assert state.candidates("m", lora="sql") == [] and state.adapters() == {}


def test_progress_is_when_the_engine_step_count_last_moved() -> None:
    from schemas import WorkerLoad

    state = FleetState()
    state.upsert(reg("a"))

    def report(steps: int, now: float) -> None:
        state.apply_load(
            WorkerLoad("a", "m", "agg", 0.0, 1, 5, 8, 0.1, 100, steps_total=steps), now
        )

    assert state.progress_at("a") == 0.0
    report(0, 1.0)
    assert state.progress_at("a") == 0.0  # no step yet
    report(7, 2.0)
    report(7, 3.0)  # reports go on, the engine does not: still 2.0
    assert state.progress_at("a") == 2.0
    report(9, 4.0)
    assert state.progress_at("a") == 4.0 and state.progress_at("gone") == 0.0


def test_candidate_lists_are_built_once_per_change_of_who_may_serve() -> None:
    """A request asks for its candidates several times: with 1,024 workers a list per ask would
    cost more than the route. Heartbeats and load reports keep the list; a join, a departure or
    a status change rebuilds it."""
    import msgspec

    from schemas import WorkerLoad

    state = FleetState()
    for w in ("a", "b", "c"):
        state.upsert(reg(w))
    first = state.candidates("m")
    state.upsert(msgspec.structs.replace(reg("a"), heartbeat_at_s=9.0))  # a heartbeat
    state.apply_load(WorkerLoad("b", "m", "agg", 1.0, 1, 0, 8, 0.1, 100), now=1.0)
    assert state.candidates("m") is first
    assert [v.worker_id for v in state.candidates("m", exclude=["b"])] == ["a", "c"]
    assert state.candidates("m") is first  # an exclusion does not touch the kept list
    state.upsert(reg("d"))
    joined = state.candidates("m")
    assert joined is not first and len(joined) == 4
    state.upsert(reg("a", status="draining"))
    assert [v.worker_id for v in state.candidates("m")] == ["b", "c", "d"]
    state.remove("c")
    assert [v.worker_id for v in state.candidates("m")] == ["b", "d"]


# ---- the sums a request asks for, kept between refreshes

_OPS = st.lists(
    st.tuples(
        st.sampled_from(["count", "load", "capacity", "join", "leave"]),
        st.integers(0, 5),  # which worker
        st.integers(-2, 12),  # a delta, a count, a capacity
        st.integers(0, 6),  # waiting
    ),
    max_size=60,
)


def _sums(state: FleetState, now: float | None, fresh_after: float) -> tuple[int, bool, int]:
    return (
        state.room("m", ("agg",), None, 3, fresh_after, now),
        state.saturated("m", ("agg",), 4, None, 10, now),
        state._sum(("m", ("agg",), None), "saturated", 4, 0.0, now),
    )


@settings(max_examples=300, deadline=None)
@given(_OPS)
def test_a_kept_sum_moves_with_each_change_as_a_fresh_one_would(ops: list) -> None:
    """Counts, load reports, capacity changes, joins and leaves between two asks inside one
    refresh period: the kept sums equal those summed afresh (the horizon held still)."""
    state = FleetState()
    for w in range(3):
        state.upsert(WorkerRegistration(f"w{w}", "m", "agg", "mocker", 4, 100, 16))
    now, fresh_after = 100.0, 90.0
    _sums(state, now, fresh_after)  # kept from here
    for kind, w, n, waiting in ops:
        wid = f"w{w}"
        if kind == "count":
            state.count(wid, 1 if n >= 5 else -1)
        elif kind == "load":
            at = 95.0 if n % 2 else 80.0  # a fresh report, or one already older than the horizon
            load = WorkerLoad(wid, "m", "agg", 0.0, max(n, 0), waiting, 4, 0.0, 100)
            state.apply_load(load, at)
        elif kind == "capacity":
            state.upsert(WorkerRegistration(wid, "m", "agg", "mocker", max(n, 1), 100, 16))
        elif kind == "join":
            state.upsert(WorkerRegistration(wid, "m", "agg", "mocker", 4, 100, 16))
        else:
            state.remove(wid)
        assert _sums(state, now + 0.5, fresh_after) == _sums(state, None, fresh_after)


def test_a_kept_sum_is_summed_afresh_once_a_refresh_period() -> None:
    """What only time changes (a report grown older than the horizon) shows at the next
    refresh, not before."""
    state = FleetState()
    state.upsert(WorkerRegistration("w", "m", "agg", "mocker", 4, 100, 16))
    state.apply_load(WorkerLoad("w", "m", "agg", 0.0, 4, 5, 4, 0.0, 100), 10.0)
    assert state.room("m", ("agg",), None, 3, 9.5, now=10.0) == 0  # 5 waiting: trusted
    assert state.room("m", ("agg",), None, 3, 10.2, now=10.5) == 0  # kept: the old horizon
    assert SUM_REFRESH_S <= 1.0
    assert state.room("m", ("agg",), None, 3, 10.5, now=11.0) == 7  # summed afresh: stale


def test_a_caller_with_another_horizon_gets_a_fresh_sum() -> None:
    state = FleetState()
    state.upsert(WorkerRegistration("w", "m", "agg", "mocker", 4, 100, 16))
    state.apply_load(WorkerLoad("w", "m", "agg", 0.0, 4, 5, 4, 0.0, 100), 10.0)
    assert state.room("m", ("agg",), None, 3, 5.0, now=10.0) == 0  # the report trusted
    assert state.room("m", ("agg",), None, 3, 20.0, now=10.1) == 7  # this caller does not


def test_more_keys_than_are_kept_still_sum_right(monkeypatch: pytest.MonkeyPatch) -> None:
    """Adapters come and go: past ``MAX_KEPT_SUMS`` a model's least recently summed is dropped,
    and every sum stays what a fresh one gives."""
    monkeypatch.setattr(fleet_state_module, "MAX_KEPT_SUMS", 4)
    state = FleetState()
    loras = tuple(f"a{i}" for i in range(6))
    for w in range(3):
        state.upsert(WorkerRegistration(f"w{w}", "m", "agg", "mocker", 4, 100, 16, loras=loras[w:]))
    for step in range(40):
        lora = loras[step % len(loras)]
        state.count(f"w{step % 3}", 1)
        kept = state.room("m", ("agg",), lora, 2, 0.0, now=1.0)
        assert kept == state.room("m", ("agg",), lora, 2, 0.0)
        assert len(state._sums["m"]) <= 4
