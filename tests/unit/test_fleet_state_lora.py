"""Routing by LoRA adapter (pure): only workers that have the adapter loaded are candidates, and
the fleet knows which model each loaded adapter adapts."""

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
