"""``jetfleet status`` (``fleet_status``) on a fleet its first component is still setting up: no
fleet yet (``NoFleetError``), whichever of its buckets are made, never a fleet with workers and no
models, and never another error a caller that polls for workers would not expect (stop 47's red
CI: a test's poll met the models bucket missing after the registrations were made)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from base.topology import TopologyReport, ensure_bucket, ensure_topology
from infra.tools import NoFleetError, fleet_status
from schemas import Subjects, WorkerRegistration, encode
from schemas.streams import HEARTBEATS_BUCKET, MODELS_BUCKET, fleet_topology
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


async def test_every_registration_is_listed_and_a_bad_one_left_out(
    nc: NATS, js: JetStreamContext, capsys: pytest.CaptureFixture[str]
) -> None:
    subjects = Subjects(f"many{uuid.uuid4().hex[:6]}")
    await ensure_topology(js, subjects)
    heartbeats = await js.key_value(subjects.bucket_name(HEARTBEATS_BUCKET))
    for i in range(60):
        reg = WorkerRegistration(
            worker_id=f"w{i}", model="m", role="agg", engine="mocker", max_num_seqs=8,
            num_gpu_blocks=64, block_size=16, heartbeat_at_s=time.time(), ttl_s=60,
        )  # fmt: skip
        await heartbeats.put(f"w{i}", encode(reg))
    await heartbeats.put("w7", b"\xff not a registration")
    await heartbeats.delete("w8")
    report = await fleet_status(nc, subjects)
    listed = {w["worker_id"] for w in report["workers"]}
    assert listed == {f"w{i}" for i in range(60)} - {"w7", "w8"}
    assert all(w["status"] == "ready" for w in report["workers"])
    assert "registration w7 unreadable" in capsys.readouterr().err
