"""Faults between hosts: a multi-host fleet in network namespaces (``tests.chaos.multihost``),
partitioned, paused and powered off under load (HTTP and NATS-only clients), judged by the
checker (``tests.chaos.checker``): every accepted request ends exactly once, complete or with a
clear error; no token stream carries two attempts interleaved; nothing hangs past 120 s.

    pytest -m slow tests/chaos/test_partitions.py -s     # every fault, then the table

The fast variant (a worker host partitioned for 10 s and healed) runs in the default suite.
Needs root and ``ip netns``: where they are missing the tests fail and say so (they do not skip:
CI runs as root, and a harness that silently ran nothing would prove nothing).

The faults the design survives must show 0 lost and 0 duplicated. Two rows are measured and
held to 0 lost only: a power failure under nats-server's lazy sync policy (not a fault the
design claims to survive; the fleet ships ``sync_interval: always``, held to 0), and the requests
stream's leader isolated in a minority (not yet survived in full: interleaved token streams, see
its test). docs/operating/reliability-multihost.md has the figures.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.checker import Row, table
from tests.chaos.faults import (
    Fault,
    Outcome,
    frontend_partition,
    nats_leader_minority,
    nats_pause,
    power_failure,
    redis_primary_partition,
    under_fault,
    worker_partition,
)
from tests.chaos.multihost import MultiHostFleet

pytestmark = pytest.mark.integration

_ROWS: list[Row] = []


@pytest.fixture(scope="module", autouse=True)
def fault_table() -> Iterator[None]:
    yield
    if _ROWS:
        print("\n\nFaults between hosts (tests/chaos/test_partitions.py)\n" + table(_ROWS))


def _play(tmp: Path, name: str, fault: Fault, fleet_kw: dict[str, object], **kw: object) -> Outcome:
    with MultiHostFleet(tmp, **fleet_kw) as fleet:  # type: ignore[arg-type]
        outcome = asyncio.run(under_fault(fleet, name, fault, **kw))  # type: ignore[arg-type]
        migrated = fleet.count_in_logs("request_migrating", ["frontend", "router"])
        restarts = dict(fleet.restarts)
        outcome.trails = {t.request_id: fleet.lines_about(t.request_id) for _, t in outcome.shown()}
    outcome.notes["migrations"] = migrated
    outcome.notes["component_restarts"] = restarts
    _ROWS.append(outcome.row)
    print(f"\n{table([outcome.row])}\nnotes: {json.dumps(outcome.notes)}\n{outcome.examples()}")
    return outcome


def test_a_worker_host_partitioned_and_healed_loses_nothing(tmp_path: Path) -> None:
    """The fast variant: w1 cut off for 10 s (past its 4 s TTL: its requests migrate), then
    back. Red without the worker's fence: the chunks it wrote as the link went down reached the
    token streams at the heal, after the newer attempts' (seen as 2-6 interleaved streams)."""
    fault = worker_partition("w1", hold_s=10.0)
    out = _play(tmp_path, "worker host partitioned 10 s", fault, {"workers": 2},
                before=30, after=30)  # fmt: skip
    assert out.notes["migrations"], "nothing migrated: the partition did not bite"
    assert out.row.lost == 0 and out.row.duplicated == 0, out.examples()
    assert out.notes["interleaved_requests"] == 0
    assert out.row.completed + out.row.clear_errors == out.row.requests


SURVIVED = {
    "worker host partitioned 30 s": (worker_partition("w1", 30.0), {}),
    "NATS requests leader paused 10 s": (nats_pause(10.0), {}),
    "Redis primary partitioned 30 s": (redis_primary_partition(30.0), {}),
    "frontend partitioned from NATS 30 s": (frontend_partition(30.0), {}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SURVIVED))
def test_a_fault_the_design_survives_loses_nothing(tmp_path: Path, name: str) -> None:
    fault, fleet_kw = SURVIVED[name]
    out = _play(tmp_path, name, fault, fleet_kw)
    assert out.row.lost == 0 and out.row.duplicated == 0, out.examples()
    assert out.notes["interleaved_requests"] == 0
    assert not out.notes.get("acked_messages_lost"), out.notes


@pytest.mark.slow
def test_a_power_failure_under_sync_always_loses_no_acknowledged_message(tmp_path: Path) -> None:
    """Every NATS node killed at once, each disk left as the device held it, under the policy the
    fleet ships. Held: no acknowledged message of an append-only stream gone, on any node; no
    HTTP request lost or duplicated. Printed, not held: NATS-only clients across the restart
    (FLEET_TOKENS is a memory stream, emptied by it; a client that missed chunks while NATS was
    down, or whose router service migrated a request at another token than the client had
    reached, can end short, late or with tokens repeated: 0-1 of each per run)."""
    out = _play(tmp_path, "power failure, sync_interval always", power_failure(), {"disks": True})
    assert not out.notes["acked_messages_lost"], out.notes
    assert not any(out.notes["lost_per_node"].values()), out.notes  # type: ignore[union-attr]
    assert out.notes["lost_or_duplicated_by_client"]["http"] == 0, out.examples()  # type: ignore[index]
    assert out.notes["interleaved_requests"] == 0


@pytest.mark.slow
def test_the_requests_leader_isolated_in_a_minority_loses_nothing(tmp_path: Path) -> None:
    """Not yet survived in full: nothing is lost, but in four of seven runs 2-5 token streams
    carried an older attempt's chunk after a newer one's (0 in the two runs after the late-delivery
    fence). The workers of the isolated node reconnect elsewhere
    within 2.3 s, but the workers bucket and the token stream, led by that node too, take 10-15 s
    to elect new leaders on this machine: routers expire those workers and migrate their
    requests, and a worker's reconnect check cannot read the token stream meanwhile and lets the
    request go on (docs/operating/reliability-multihost.md). Frontends drop the stale chunks,
    and so does a NATS-only client reading by the protocol (``TokenReader``); the checker still
    counts such a stream as duplicated (what reached the wire). Asserted: nothing lost; printed:
    the rest."""
    out = _play(tmp_path, "NATS requests leader isolated 30 s", nats_leader_minority(30.0), {})
    assert out.row.lost == 0, out.examples()


@pytest.mark.slow
def test_a_power_failure_under_the_lazy_sync_policy_is_measured(tmp_path: Path) -> None:
    """nats-server's default: writes acknowledged at once, fsynced every 2 minutes. Not a fault
    the design claims to survive: the row and the acknowledged messages lost are printed."""
    fault = power_failure()
    out = _play(tmp_path, "power failure, sync_interval 2m", fault,
                {"disks": True, "sync_interval": "2m"})  # fmt: skip
    assert out.row.requests > 0
