from __future__ import annotations

from datetime import timedelta

import pytest

from infra.jetstream import TopologyReport, ensure_stream, ensure_topology
from schemas import Subjects
from schemas.streams import fleet_topology

pytestmark = pytest.mark.integration


async def test_topology_is_created_then_unchanged(nc, subjects):
    js = nc.jetstream()
    first = await ensure_topology(js, subjects)
    topo = fleet_topology(subjects)
    assert set(first.created) >= {s.name for s in topo.streams}
    assert not first.updated
    second = await ensure_topology(js, subjects)
    assert not second.created and not second.updated
    info = await js.stream_info(subjects.stream_name("TOKENS"))
    assert info.config.subjects == [subjects.tok_all()]
    assert info.config.max_age == 3600


async def test_changed_limit_is_applied_as_update(nc, subjects):
    js = nc.jetstream()
    await ensure_topology(js, subjects)
    spec = fleet_topology(subjects).by_name[subjects.stream_name("METRICS")]
    from dataclasses import replace

    report = TopologyReport()
    await ensure_stream(js, replace(spec, max_age=timedelta(hours=2)), report)
    assert report.updated == [spec.name]
    assert (await js.stream_info(spec.name)).config.max_age == 7200


async def test_two_fleets_share_one_server(nc):
    js = nc.jetstream()
    a, b = Subjects("fleeta"), Subjects("fleetb")
    await ensure_topology(js, a)
    await ensure_topology(js, b)
    ack = await js.publish(a.tok("r1"), b"x")
    assert ack.stream == a.stream_name("TOKENS")
    ack = await js.publish(b.tok("r1"), b"y")
    assert ack.stream == b.stream_name("TOKENS")
