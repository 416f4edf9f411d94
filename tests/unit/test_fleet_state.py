"""FleetState (pure): routing by LoRA adapter (only workers holding it are candidates), and each
worker's progress as its engine step count moves."""

from __future__ import annotations

from router.fleet_state import FleetState
from schemas import WorkerRegistration


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
