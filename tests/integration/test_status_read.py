"""``jetfleet status`` (``fleet_status``) on a fleet its first component is still setting up: no
fleet yet (``NoFleetError``), whichever of its buckets are made, never a fleet with workers and no
models, and never another error a caller that polls for workers would not expect (stop 47's red
CI: a test's poll met the models bucket missing after the registrations were made)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from base.topology import TopologyReport, ensure_bucket, ensure_topology
from infra.tools import NoFleetError, fleet_status
from schemas import Subjects
from schemas.streams import MODELS_BUCKET, fleet_topology
from tests.support.fleet import Fleet

pytestmark = pytest.mark.integration


async def test_a_fleet_half_set_up_reads_as_no_fleet(
    nc: NATS, js: JetStreamContext, nats_url: str, tmp_path: Path
) -> None:
    subjects = Subjects(f"half{uuid.uuid4().hex[:6]}")
    fleet = Fleet(nats_url, tmp_path, prefix=subjects.prefix)
    topo = fleet_topology(subjects, 1, None)
    assert topo.buckets[-1].name == subjects.bucket_name(MODELS_BUCKET)  # made last
    report = TopologyReport()
    for made in range(len(topo.buckets)):  # none made, then all but the models bucket
        for bucket in topo.buckets[:made]:
            await ensure_bucket(js, bucket, report)
        with pytest.raises(NoFleetError):
            await fleet_status(nc, subjects)
        assert await fleet.registered_workers() == {}
    await ensure_topology(js, subjects)
    assert await fleet_status(nc, subjects) == {"models": [], "workers": []}
