"""What a router knows about the fleet: live workers, their reported load, local in-flight counts.

Pure state (no I/O). The discovery watcher feeds it registrations, deletions and load reports, and
removes a worker that deregistered, restarted or whose heartbeat is older than its ``ttl_s``
(``base.worker_watch``); the removal is the one way a client learns a worker left
(``on_departure``), so its requests there migrate. The router reads candidates from it, and the
clients keep its one in-flight count (``count``).

A request asks for its candidates several times (wait for a worker, shed, route): each list is
built once per change of who may serve (a worker joins, leaves, changes status, role or
adapters; not a heartbeat, not a load report) and kept, so a request costs the same with 16
workers and with 1,024. Callers must not change the lists they are given.

The sums a request asks for over its candidates (``saturated``: room left before shedding;
``room``: room left before holding) are kept the same way when the caller gives the time: each
is summed over the candidates at most once a ``SUM_REFRESH_S`` (and when who may serve changes),
and between, a worker's count or load report moves it by that worker's change alone (at most
``MAX_KEPT_SUMS`` are kept a model, the least recently summed dropped first). A request
then costs the same with 16 workers and with 4,096 (a pass over 1,024 cost ~0.5 ms for each
sum); what only time changes (a report growing older than ``fresh_after``) is seen at the next
refresh.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from schemas import WorkerLoad, WorkerRegistration

SUM_REFRESH_S = 1.0  # a kept sum over the candidates is summed again at least this often
MAX_KEPT_SUMS = 128  # a model's kept sums (two a key: its roles and adapters)
_SumKey = tuple[str, tuple[str, ...], str | None, str, int]  # model, roles, lora, kind, bound


@dataclass(slots=True)
class WorkerView:
    reg: WorkerRegistration
    load: WorkerLoad | None = None
    load_at: float = 0.0  # local monotonic time of the last load report
    progress_at: float = 0.0  # local monotonic time its engine step count last moved
    in_flight: int = 0  # requests this router sent that have not finished
    remote_prefills: int = 0  # of those, remote prefills (a disaggregated prefill pool's queue)
    since_load: int = 0  # requests this router sent it less those that ended, since its report

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

    def queue_depth(self, fresh_after: float = float("-inf")) -> int:
        """Requests waiting on the worker for a slot, as best known (negative: free slots):
        beyond its ``max_num_seqs`` (its last report, plus what was sent since less what ended),
        or, when that report had some waiting (its KV cache full), those plus what was sent since
        (they wait too) less what ended (a slot freed). A report from before ``fresh_after``
        (monotonic) is not trusted: then only the requests this router counts."""
        if self.load is None or self.load_at < fresh_after:
            return self.in_flight - self.capacity
        load, since = self.load, self.since_load
        beyond = max(self.in_flight, load.num_running + load.num_waiting + since) - self.capacity
        return max(beyond, load.num_waiting + since) if load.num_waiting > 0 else beyond


@dataclass(slots=True)
class _Sum:
    """A sum over a key's candidates, kept: each worker's term and their total."""

    kind: str  # "saturated" or "room"
    bound: int
    fresh_after: float
    version: int
    at: float
    terms: dict[str, int]
    total: int

    def term(self, v: WorkerView) -> int:
        if self.kind == "saturated":
            return max(v.capacity + self.bound - v.queued_estimate(), 0)
        return max(self.bound - v.queue_depth(self.fresh_after), 0)


def _serving(reg: WorkerRegistration) -> tuple[object, ...]:
    """What decides whom a registration may serve (a change rebuilds the candidate lists)."""
    return (reg.model, reg.role, reg.status, reg.loras, reg.block_size, reg.kv_branch_blocks)


@dataclass
class FleetState:
    workers: dict[str, WorkerView] = field(default_factory=dict)
    _departures: list[Callable[[str], None]] = field(default_factory=list, init=False, repr=False)
    version: int = field(default=0, init=False)  # bumped when who may serve what changes
    _lists: dict[tuple[str, tuple[str, ...], str | None], tuple[int, list[WorkerView]]] = field(
        default_factory=dict, init=False, repr=False
    )
    _sums: dict[str, dict[_SumKey, _Sum]] = field(default_factory=dict, init=False, repr=False)

    def on_departure(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(worker_id)`` for each worker removed from now on."""
        self._departures.append(callback)

    def upsert(self, reg: WorkerRegistration) -> None:
        view = self.workers.get(reg.worker_id)
        if view is None:
            self.workers[reg.worker_id] = WorkerView(reg)
            self.version += 1
        else:
            if _serving(view.reg) != _serving(reg):
                self.version += 1
            view.reg = reg
            self._moved(view)

    def remove(self, worker_id: str) -> None:
        """The worker left (deregistered, restarted under its id, or silent past its TTL)."""
        if self.workers.pop(worker_id, None) is not None:
            self.version += 1
        for callback in self._departures:
            callback(worker_id)

    def count(self, worker_id: str, delta: int, remote_prefill: bool = False) -> None:
        """A request of this router's started (+1) or stopped (-1) running on ``worker_id``
        ("" or a worker not known: nothing to count)."""
        view = self.workers.get(worker_id) if worker_id else None
        if view is not None:
            view.in_flight = max(view.in_flight + delta, 0)
            view.since_load += delta
            if remote_prefill:
                view.remote_prefills = max(view.remote_prefills + delta, 0)
            self._moved(view)

    def apply_load(self, load: WorkerLoad, now: float) -> None:
        view = self.workers.get(load.worker_id)
        if view is not None:
            before = view.load.steps_total if view.load is not None else 0
            if load.steps_total != before:  # (a worker that reports no steps never moves)
                view.progress_at = now
            view.load = load
            view.load_at = now
            view.since_load = 0
            self._moved(view)

    def _moved(self, view: WorkerView) -> None:
        """The worker's counts changed: move each kept sum it is in by its own change (only
        its model's sums are looked at)."""
        for agg in self._sums.get(view.reg.model, {}).values():
            old = agg.terms.get(view.worker_id)
            if old is not None:
                new = agg.term(view)
                agg.terms[view.worker_id] = new
                agg.total += new - old

    def _sum(
        self,
        key: tuple[str, tuple[str, ...], str | None],
        kind: str,
        bound: int,
        fresh_after: float,
        now: float | None,
    ) -> int:
        """``kind``'s sum over the key's candidates: kept when ``now`` is given (see the module's
        docstring), summed afresh otherwise. A kept sum serves a caller whose ``fresh_after``
        is at most ``SUM_REFRESH_S`` past the one it was summed with (a caller with another
        horizon gets a fresh one)."""
        model, roles, lora = key
        cands = self.candidates(model, roles, lora=lora)
        kept = self._sums.setdefault(model, {}) if now is not None else {}
        agg = kept.get((*key, kind, bound))
        if (
            agg is not None
            and now is not None
            and agg.version == self.version
            and now - agg.at < SUM_REFRESH_S
            and 0.0 <= fresh_after - agg.fresh_after < SUM_REFRESH_S
        ):
            return agg.total
        agg = _Sum(kind, bound, fresh_after, self.version, now or 0.0, {}, 0)
        agg.terms = {v.worker_id: agg.term(v) for v in cands}
        agg.total = sum(agg.terms.values())
        if now is not None:
            kept.pop((*key, kind, bound), None)
            if len(kept) >= MAX_KEPT_SUMS:  # the longest kept goes (adapters come and go)
                del kept[next(iter(kept))]
            kept[(*key, kind, bound)] = agg
        return agg.total

    def progress_at(self, worker_id: str) -> float:
        """When the worker's engine last took a step, as its load reports show (0: never
        seen): a request queued there waits while this moves (``TokenStream.check_stall``)."""
        view = self.workers.get(worker_id)
        return view.progress_at if view is not None else 0.0

    def candidates(
        self,
        model: str,
        role: str | tuple[str, ...] = "agg",
        exclude: Iterable[str] = (),
        lora: str | None = None,
    ) -> list[WorkerView]:
        """Ready workers of ``model`` in ``role`` (or any of several roles); with ``lora``, only
        those that have that adapter loaded. The same list object while nobody joins or leaves
        (unless ``exclude`` names one of them)."""
        roles = (role,) if isinstance(role, str) else role
        key = (model, roles, lora)
        found = self._lists.get(key)
        if found is None or found[0] != self.version:
            ready = [
                v
                for v in self.workers.values()
                if v.reg.model == model
                and v.reg.role in roles
                and v.reg.status == "ready"
                and (lora is None or lora in v.reg.loras)
            ]
            if len(self._lists) > 256:
                self._lists.clear()
            found = self._lists[key] = (self.version, ready)
        skip = set(exclude)
        if skip and any(v.worker_id in skip for v in found[1]):
            return [v for v in found[1] if v.worker_id not in skip]
        return found[1]

    def models(self) -> set[str]:
        return {v.reg.model for v in self.workers.values()}

    def adapters(self) -> dict[str, str]:
        """LoRA adapter -> the model it adapts, for every adapter a ready worker has loaded."""
        return {
            lora: v.reg.model
            for v in self.workers.values()
            if v.reg.status == "ready"
            for lora in v.reg.loras
        }

    def is_alive(self, worker_id: str) -> bool:
        return worker_id in self.workers

    def saturated(
        self,
        model: str,
        role: str | tuple[str, ...],
        max_waiting_per_worker: int,
        lora: str | None = None,
        held: int = 0,
        now: float | None = None,
    ) -> bool:
        """True when the candidates hold capacity + the waiting bound each, counting ``held``
        (requests a frontend holds for them) into the room they have left. ``now``
        (monotonic): the sum may be a kept one (the module's docstring)."""
        roles = (role,) if isinstance(role, str) else role
        if not self.candidates(model, roles, lora=lora):
            return False
        left = self._sum((model, roles, lora), "saturated", max_waiting_per_worker, 0.0, now)
        return left <= held

    def room(
        self,
        model: str,
        role: str | tuple[str, ...],
        lora: str | None,
        waiting_per_worker: int,
        fresh_after: float = float("-inf"),
        now: float | None = None,
    ) -> int:
        """How many more requests the candidates take before each has ``waiting_per_worker``
        waiting for a slot (``WorkerView.queue_depth``): their free slots and that many more.
        ``now`` (monotonic): the sum may be a kept one (the module's docstring)."""
        roles = (role,) if isinstance(role, str) else role
        return self._sum((model, roles, lora), "room", waiting_per_worker, fresh_after, now)
