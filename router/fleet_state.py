"""What a router knows about the fleet: live workers, their reported load, local in-flight counts.

Pure state (no I/O). The discovery watcher feeds it registrations, deletions and load reports, and
removes a worker whose heartbeat is older than its ``ttl_s`` (``base.worker_watch``), reporting it
so in-flight requests can migrate; the router reads candidates from it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from schemas import WorkerLoad, WorkerRegistration


@dataclass(slots=True)
class WorkerView:
    reg: WorkerRegistration
    load: WorkerLoad | None = None
    load_at: float = 0.0  # local monotonic time of the last load report
    in_flight: int = 0  # requests this router sent that have not finished

    @property
    def worker_id(self) -> str:
        return self.reg.worker_id

    @property
    def capacity(self) -> int:
        return max(self.reg.max_num_seqs, 1)

    def queued_estimate(self) -> int:
        """Requests on the worker as best known: the larger of the report and our own count."""
        reported = 0 if self.load is None else self.load.num_running + self.load.num_waiting
        return max(reported, self.in_flight)


@dataclass
class FleetState:
    workers: dict[str, WorkerView] = field(default_factory=dict)

    def upsert(self, reg: WorkerRegistration) -> None:
        view = self.workers.get(reg.worker_id)
        if view is None:
            self.workers[reg.worker_id] = WorkerView(reg)
        else:
            view.reg = reg

    def remove(self, worker_id: str) -> WorkerView | None:
        return self.workers.pop(worker_id, None)

    def apply_load(self, load: WorkerLoad, now: float) -> None:
        view = self.workers.get(load.worker_id)
        if view is not None:
            view.load = load
            view.load_at = now

    def candidates(
        self, model: str, role: str | tuple[str, ...] = "agg", exclude: Iterable[str] = ()
    ) -> list[WorkerView]:
        """Ready workers of ``model`` in ``role`` (or any of several roles)."""
        skip = set(exclude)
        roles = (role,) if isinstance(role, str) else role
        return [
            v
            for v in self.workers.values()
            if v.reg.model == model
            and v.reg.role in roles
            and v.reg.status == "ready"
            and v.worker_id not in skip
        ]

    def models(self) -> set[str]:
        return {v.reg.model for v in self.workers.values()}

    def is_alive(self, worker_id: str) -> bool:
        return worker_id in self.workers

    def saturated(
        self, model: str, role: str | tuple[str, ...], max_waiting_per_worker: int
    ) -> bool:
        """True when every candidate holds more than capacity + the waiting bound."""
        cands = self.candidates(model, role)
        if not cands:
            return False
        return all(v.queued_estimate() >= v.capacity + max_waiting_per_worker for v in cands)
