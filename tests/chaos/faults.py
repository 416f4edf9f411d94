"""Faults between hosts, each played against a ``MultiHostFleet`` under load, and the runner that
judges one: load (HTTP and NATS-only clients) runs before, during and after the fault; the
checker's row says what became of every request.

Each fault holds for a stated time (a deliberate hold, not a wait for state), heals, then waits
on the condition that says the fleet took the healed part back. It returns notes (figures that
belong to that fault: the leader it isolated, the writes a deposed primary took, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tests.chaos.checker import Row, Trace, Verdict, judge
from tests.chaos.load import Load
from tests.chaos.multihost import MultiHostFleet
from tests.support.up import ready_workers
from tests.support.wait import wait_for

Notes = dict[str, object]
Fault = Callable[[MultiHostFleet], Awaitable[Notes]]


@dataclass
class Outcome:
    row: Row
    by: dict[Verdict, list[Trace]]
    notes: Notes = field(default_factory=dict)
    trails: dict[str, list[str]] = field(default_factory=dict)  # request id -> fleet log lines

    def examples(self, verdicts: tuple[str, ...] = ("lost", "duplicated"), n: int = 5) -> str:
        out = []
        for v, t in self.shown(verdicts, n):
            out.append(f"{v}: {t.kind} {t.request_id} seed={t.seed} end={t.end!r} "
                       f"pieces={len(t.output)} interleaved={t.interleaved}")  # fmt: skip
            out += [f"  {line}" for line in self.trails.get(t.request_id, [])]
        return "\n".join(out)

    def shown(
        self, verdicts: tuple[str, ...] = ("lost", "duplicated"), n: int = 5
    ) -> list[tuple[str, Trace]]:
        """The requests ``examples`` shows: the first ``n`` of each verdict."""
        return [(v, t) for v in verdicts for t in self.by.get(v, [])[:n]]


async def under_fault(
    fleet: MultiHostFleet,
    name: str,
    fault: Fault,
    *,
    http: int = 12,
    nats: int = 6,
    before: int = 40,
    after: int = 60,
    max_tokens: int = 64,
    bound_s: float = 120.0,
) -> Outcome:
    """Load; ``before`` requests ended; the fault (hold, heal, recovery); ``after`` more requests
    completed; stop the load and wait for every request to end (or pass its bound)."""
    load = Load(fleet.base_url, fleet.nats_url, fleet.subjects, max_tokens=max_tokens,
                bound_s=bound_s)  # fmt: skip
    async with load:
        await load.take_references()
        stop = asyncio.Event()
        runner = asyncio.create_task(load.run(http, nats, stop))
        try:
            await wait_for(lambda: sum(t.ended_at > 0 for t in load.traces) >= before, 120)
            notes = await fault(fleet)
            healed_at = time.monotonic()

            def completed_after() -> bool:
                done = [t for t in load.traces if t.ended_at > healed_at]
                return sum(t.end.startswith("finish:") for t in done) >= after

            await wait_for(completed_after, 240, interval=0.2)
        finally:
            stop.set()
            await runner
        notes["interleaved_requests"] = await load.mark_interleaved()
        row, by = judge(name, load.traces, load.references, time.monotonic())
        notes["refused_or_error"] = _reasons(by.get("refused", []) + by.get("clear_error", []))
        bad = by.get("lost", []) + by.get("duplicated", [])
        notes["lost_or_duplicated_by_client"] = {
            kind: sum(t.kind == kind for t in bad) for kind in ("http", "nats")
        }
    return Outcome(row, by, notes)


def _reasons(traces: list[Trace]) -> dict[str, int]:
    """How requests ended, by the first word of their end (``refused:503``, ``error:...``)."""
    out: dict[str, int] = {}
    for t in traces:
        key = t.end.split(" ")[0][:60]
        out[key] = out.get(key, 0) + 1
    return out


async def _net(fn: Callable[..., object], *args: object) -> None:
    await asyncio.to_thread(fn, *args)


async def wait_workers(fleet: MultiHostFleet, n: int, timeout: float = 90.0) -> None:
    await wait_for(lambda: len(ready_workers(fleet.nats_url)) >= n, timeout, interval=0.5)


async def wait_streams_current(fleet: MultiHostFleet, timeout: float = 120.0) -> None:
    """Every node back in the cluster and the requests stream led again."""
    await wait_for(lambda: all(n.meta_ready() for n in fleet.nats), timeout, interval=0.5)
    await wait_for(lambda: _has_leader(fleet, "REQUESTS"), timeout, interval=0.5)


def _has_leader(fleet: MultiHostFleet, stream: str) -> bool:
    try:
        fleet.stream_leader(stream)
    except Exception:
        return False
    return True


# ---------------------------------------------------------------------- the faults
def worker_partition(host: str = "w1", hold_s: float = 30.0) -> Fault:
    """A worker host drops off the network (every link cut) and comes back ``hold_s`` later."""

    async def fault(fleet: MultiHostFleet) -> Notes:
        await _net(fleet.net.isolate, [host])
        await asyncio.sleep(hold_s)  # the partition itself
        await _net(fleet.net.heal)
        await wait_workers(fleet, fleet.num_workers)
        return {"partitioned": host, "hold_s": hold_s}

    return fault


def nats_leader_minority(hold_s: float = 30.0) -> Fault:
    """The requests stream's leader alone in a minority: cut from the other nodes and from
    every client."""

    async def fault(fleet: MultiHostFleet) -> Notes:
        leader = fleet.stream_leader("REQUESTS").node.name
        await _net(fleet.net.isolate, [leader])
        await asyncio.sleep(hold_s)
        new_leader = fleet.stream_leader("REQUESTS").node.name
        await _net(fleet.net.heal)
        await wait_streams_current(fleet)
        return {"isolated": leader, "leader_during": new_leader, "hold_s": hold_s}

    return fault


def nats_pause(hold_s: float = 10.0) -> Fault:
    """The requests stream's leader stopped (SIGSTOP) for ``hold_s``, then resumed."""

    async def fault(fleet: MultiHostFleet) -> Notes:
        node = fleet.stream_leader("REQUESTS")
        node.pause()
        await asyncio.sleep(hold_s)
        node.resume()
        await wait_streams_current(fleet)
        return {"paused": node.node.name, "hold_s": hold_s}

    return fault


def frontend_partition(hold_s: float = 30.0) -> Fault:
    """The frontend host loses every NATS node (its clients and Redis still reach it)."""

    async def fault(fleet: MultiHostFleet) -> Notes:
        await _net(fleet.net.cut, ["fe"], ["n1", "n2", "n3"])
        await asyncio.sleep(hold_s)
        await _net(fleet.net.heal)
        await wait_for(fleet._frontend_ready, 90, interval=0.5)
        return {"hold_s": hold_s}

    return fault


def redis_primary_partition(hold_s: float = 30.0, still_reaches: str = "svc") -> Fault:
    """The Redis primary cut from the sentinels, its replica and the fleet, except one host
    (``svc``: the indexer and the router service) that still reaches it. The sentinels promote
    the replica while the old primary goes on taking that host's writes; at the heal it becomes
    a replica of the new one and those writes are gone. Notes: the promotion time, the writes
    the deposed primary took (lost), and how long after the heal the index on the new primary
    had caught up with FLEET_KV again (the indexer replays from the position stored with it)."""

    async def fault(fleet: MultiHostFleet) -> Notes:
        ha = fleet.redis
        assert ha is not None
        old, new = ha.data_hosts
        writes_before = ha.writes(old)
        fleet_hosts = [h for h in fleet.net.hosts if h not in (old.name, still_reaches, "clients")]
        cut_at = time.monotonic()
        await _net(fleet.net.cut, [old.name], fleet_hosts)
        await wait_for(lambda: ha.primary() == new.ip, 60, interval=0.2)
        promoted_s = time.monotonic() - cut_at
        await asyncio.sleep(max(0.0, hold_s - promoted_s))  # the rest of the partition
        lost_writes = ha.writes(old) - writes_before
        await _net(fleet.net.heal)
        healed_at = time.monotonic()
        await wait_for(lambda: ha.role(old) == "slave", 60, interval=0.2)
        caught_up_s = await _index_caught_up(fleet, new) - healed_at
        return {
            "promoted_after_s": round(promoted_s, 1),
            "writes_on_deposed_primary": lost_writes,
            "index_caught_up_after_heal_s": round(caught_up_s, 1),
        }

    return fault


async def _index_caught_up(fleet: MultiHostFleet, primary: object, timeout: float = 120) -> float:
    """When the index on the primary has applied every FLEET_KV message published so far."""
    import nats

    from tests.chaos.servers import HostRedis

    ha = fleet.redis
    assert isinstance(ha, HostRedis)
    host = next(h for h in ha.data_hosts if h is primary)
    nc = await nats.connect(fleet.nats_url.split(","))
    try:
        target = (await nc.jetstream().stream_info(fleet.subjects.stream_name("KV"))).state.last_seq

        def applied() -> bool:
            with ha.client(host) as r:
                keys = list(r.scan_iter(match="*:pos", count=1000))
                seq = max((int(r.hget(k, "seq") or 0) for k in keys), default=0)
            return seq >= target

        await wait_for(applied, timeout, interval=0.5)
    finally:
        await nc.close()
    return time.monotonic()


def power_failure(off_s: float = 5.0) -> Fault:
    """Every NATS node killed at once (SIGKILL) and, when the fleet runs on disks of their own,
    each disk left as the device held it (a power cut: what was not written back is gone); the
    nodes start again ``off_s`` later. The fleet's hosts reach them only once all three have
    recovered, so the stream state read first is what the disks kept. Notes: per stream, the
    messages acknowledged before the cut that are gone after it (by last sequence), and whether
    the three nodes agree on the requests stream afterwards."""

    async def fault(fleet: MultiHostFleet) -> Notes:
        before, _ = _stream_seqs(fleet)
        for node in fleet.nats:
            node.kill()
        if fleet.disks:
            for node in fleet.nats:
                node.crash_disk()
        await asyncio.sleep(off_s)  # the power is off
        # the nodes come back alone: what they recovered is read before any client writes
        await _net(fleet.net.isolate, ["n1", "n2", "n3"])
        for node in fleet.nats:
            await asyncio.to_thread(node.start, 120.0)
        await asyncio.to_thread(fleet.wait_nats_cluster, 120.0)
        names = set(before)
        await wait_for(lambda: names <= set(_stream_seqs(fleet)[0]), 120, interval=0.5)
        after, per_node = _stream_seqs(fleet)
        await _net(fleet.net.heal)
        await wait_streams_current(fleet)
        return {
            "acked_messages_lost": {k: v - after[k] for k, v in before.items() if v > after[k]},
            "lost_per_node": {
                n: {k: before[k] - seqs.get(k, 0) for k in before if seqs.get(k, 0) < before[k]}
                for n, seqs in per_node.items()
            },
        }

    return fault


# streams of file storage whose sequence only grows (no deletes, rollups or purges): a lower
# last sequence after the restart is acknowledged messages gone
_APPEND_ONLY = ("REQUESTS", "KV", "METRICS", "SCALING", "DLQ")


def _stream_seqs(fleet: MultiHostFleet) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """Per append-only stream, the last sequence its leader serves; and each node's own."""
    names = {fleet.subjects.stream_name(s) for s in _APPEND_ONLY}
    served: dict[str, int] = {}
    per_node: dict[str, dict[str, int]] = {}
    for node in fleet.nats:
        with contextlib.suppress(OSError, ValueError):
            for name, detail in node.streams().items():
                if name not in names:
                    continue
                seq = int(detail["state"]["last_seq"])
                per_node.setdefault(node.node.name, {})[name] = seq
                if (detail.get("cluster") or {}).get("leader") == node.node.name:
                    served[name] = seq
    return served, per_node
