"""``ensure_topology``: creates every stream/bucket/store, is idempotent, applies changes."""

from __future__ import annotations

import subprocess
import uuid
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from base.topology import (
    KV_STREAM,
    OBJ_STREAM,
    TopologyConflictError,
    TopologyReport,
    ensure_bucket,
    ensure_consumer,
    ensure_stream,
    ensure_topology,
)
from infra.command import cli_command
from infra.embedded import EmbeddedNats
from schemas import Subjects
from schemas.streams import MAX_REQUEST_CONSUMERS, ConsumerSpec, fleet_topology, pool_consumer

pytestmark = pytest.mark.integration


def _all_names(subjects: Subjects) -> set[str]:
    topo = fleet_topology(subjects)
    return (
        {s.name for s in topo.streams}
        | {f"kv:{b.name}" for b in topo.buckets}
        | {f"obj:{o.name}" for o in topo.object_stores}
    )


async def test_topology_is_created_with_its_subjects_and_limits(
    js: JetStreamContext, subjects: Subjects
) -> None:
    report = await ensure_topology(js, subjects)
    assert set(report.created) == _all_names(subjects)
    assert not report.updated and not report.unchanged
    for spec in fleet_topology(subjects).streams:
        cfg = (await js.stream_info(spec.name)).config
        assert sorted(cfg.subjects or []) == sorted(spec.subjects)
        assert cfg.max_age == spec.max_age.total_seconds()
        assert cfg.max_bytes == spec.max_bytes
        assert cfg.duplicate_window == spec.duplicate_window.total_seconds()
        assert cfg.storage == spec.storage
        assert cfg.retention == "limits" and cfg.discard == "old" and cfg.allow_direct
        assert cfg.max_consumers == spec.max_consumers


async def test_buckets_and_stores_are_usable(js: JetStreamContext, subjects: Subjects) -> None:
    await ensure_topology(js, subjects)
    topo = fleet_topology(subjects)
    for bucket in topo.buckets:
        kv = await js.key_value(bucket.name)
        status = await kv.status()
        assert (status.ttl or None) == (bucket.ttl.total_seconds() if bucket.ttl else None)
        assert status.history == bucket.history
        await kv.put("k", b"v")
        assert (await kv.get("k")).value == b"v"
    for store in topo.object_stores:
        obj = await js.object_store(store.name)
        await obj.put("f", b"data")
        assert (await obj.get("f")).data == b"data"


async def test_second_run_changes_nothing(js: JetStreamContext, subjects: Subjects) -> None:
    await ensure_topology(js, subjects)
    again = await ensure_topology(js, subjects)
    assert not again.changed
    assert set(again.unchanged) == _all_names(subjects)


async def test_changed_max_age_is_applied_as_update(
    js: JetStreamContext, subjects: Subjects
) -> None:
    await ensure_topology(js, subjects)
    spec = fleet_topology(subjects).by_name[subjects.stream_name("METRICS")]
    report = TopologyReport()
    await ensure_stream(js, replace(spec, max_age=timedelta(hours=2)), report)
    assert report.updated == [spec.name]
    assert (await js.stream_info(spec.name)).config.max_age == 7200
    back = await ensure_topology(js, subjects)  # the declared config wins again
    assert back.updated == [spec.name]


async def test_a_requests_stream_without_a_consumer_limit_gets_one(
    js: JetStreamContext, subjects: Subjects
) -> None:
    """A stream made before the limit was declared had the server's default (1,000 consumers
    on nats-server 2.15: one worker short of a thousand-worker fleet); infra init raises it."""
    spec = fleet_topology(subjects).by_name[subjects.stream_name("REQUESTS")]
    assert spec.max_consumers == MAX_REQUEST_CONSUMERS > 1000
    await ensure_stream(js, replace(spec, max_consumers=-1), TopologyReport())
    report = await ensure_topology(js, subjects)
    assert spec.name in report.updated
    assert (await js.stream_info(spec.name)).config.max_consumers == MAX_REQUEST_CONSUMERS


async def test_changed_bucket_ttl_is_applied_as_update(
    js: JetStreamContext, subjects: Subjects
) -> None:
    await ensure_topology(js, subjects)
    bucket = fleet_topology(subjects).buckets[0]
    report = TopologyReport()
    await ensure_bucket(js, replace(bucket, ttl=timedelta(seconds=5)), report)
    assert report.updated == [f"kv:{bucket.name}"]
    cfg = (await js.stream_info(KV_STREAM.format(bucket.name))).config
    assert cfg.max_age == 5 and cfg.duplicate_window == 5  # window may not exceed the ttl


async def test_storage_change_is_refused(js: JetStreamContext, subjects: Subjects) -> None:
    await ensure_topology(js, subjects)
    spec = fleet_topology(subjects).by_name[subjects.stream_name("TOKENS")]
    with pytest.raises(TopologyConflictError, match="storage"):
        await ensure_stream(js, replace(spec, storage="file"), TopologyReport())


async def test_two_prefixes_coexist(js: JetStreamContext) -> None:
    tag = uuid.uuid4().hex[:6]
    a, b = Subjects(f"a{tag}"), Subjects(f"b{tag}")
    await ensure_topology(js, a)
    await ensure_topology(js, b)  # would fail with error 10065 if subjects overlapped
    ta, tb = fleet_topology(a), fleet_topology(b)
    assert not {s.name for s in ta.streams} & {s.name for s in tb.streams}
    assert not {x for s in ta.streams for x in s.subjects} & {
        x for s in tb.streams for x in s.subjects
    }
    assert not {OBJ_STREAM.format(o.name) for o in ta.object_stores} & {
        OBJ_STREAM.format(o.name) for o in tb.object_stores
    }
    assert (await js.publish(a.tok("r1"), b"x")).stream == a.stream_name("TOKENS")
    assert (await js.publish(b.tok("r1"), b"y")).stream == b.stream_name("TOKENS")
    assert (await js.publish(a.submit("m"), b"z")).stream == a.stream_name("REQUESTS")


async def test_consumer_is_created_then_updated(js: JetStreamContext, subjects: Subjects) -> None:
    await ensure_topology(js, subjects)
    stream = subjects.stream_name("REQUESTS")
    spec = pool_consumer(subjects, "org/Model-1.5B", "decode")
    info = await ensure_consumer(js, stream, spec)
    assert info.config.durable_name == spec.durable
    assert info.config.filter_subject == subjects.req_pool("org/Model-1.5B", "decode")
    assert info.config.ack_policy == "explicit" and info.config.deliver_policy == "all"
    assert info.config.ack_wait == spec.ack_wait.total_seconds()
    same = await ensure_consumer(js, stream, spec)
    assert same.created == info.created
    changed = replace(spec, max_deliver=9, ack_wait=timedelta(seconds=7), deliver_policy="new")
    updated = await ensure_consumer(js, stream, changed)
    assert updated.config.max_deliver == 9 and updated.config.ack_wait == 7
    assert updated.config.deliver_policy == "all"  # JetStream cannot change it; kept


async def test_pull_consumer_delivers(js: JetStreamContext, subjects: Subjects) -> None:
    await ensure_topology(js, subjects)
    stream = subjects.stream_name("REQUESTS")
    spec = ConsumerSpec(
        durable="pull_test", filter_subject=subjects.submit_all(), deliver_policy="all"
    )
    await ensure_consumer(js, stream, spec)
    await js.publish(subjects.submit("m"), b"req")
    sub = await js.pull_subscribe_bind(spec.durable, stream=stream)
    (msg,) = await sub.fetch(1, timeout=2)
    assert msg.data == b"req"
    await msg.ack()


async def test_the_responses_retention_is_the_operators(
    js: JetStreamContext, subjects: Subjects
) -> None:
    """``infra init --responses-max-age-days/--responses-max-gib`` sets the stored responses'
    and batches' retention; a component starting (no retention given) keeps it."""
    from schemas.streams import ResponsesRetention

    await ensure_topology(js, subjects)
    names = [subjects.stream_name("RESPONSES"), subjects.stream_name("BATCHES")]
    for name in names:
        cfg = (await js.stream_info(name)).config
        assert (cfg.max_age, cfg.max_bytes) == (timedelta(days=30).total_seconds(), -1)
    chosen = ResponsesRetention(timedelta(days=7), 1 << 30)
    await ensure_topology(js, subjects, replicas=1, responses=chosen)
    await ensure_topology(js, subjects)  # a component starting
    for name in names:
        cfg = (await js.stream_info(name)).config
        assert (cfg.max_age, cfg.max_bytes) == (timedelta(days=7).total_seconds(), 1 << 30)


@pytest.mark.parametrize(
    ("memory", "disk", "said"),
    [(1 << 20, 1 << 40, "insufficient memory"), (1 << 40, 1 << 20, "insufficient storage")],
)
def test_a_server_without_room_for_the_streams_is_one_clear_line(
    tmp_path: Path, memory: int, disk: int, said: str
) -> None:
    """A full disk (or a store limit too small for the fleet's reservations): the command that
    makes the streams says which and what to do, in one line, not nats-py's traceback."""
    server = EmbeddedNats(tmp_path / "nats", port=0, max_memory_store=memory, max_file_store=disk)
    server.start()
    try:
        out = subprocess.run(
            cli_command("infra", "init", "--nats", server.url),
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        server.stop()
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    last = out.stderr.strip().splitlines()[-1]  # after the log lines of the streams it made
    assert last.startswith("jetfleet infra: JetStream has no room left for stream "), last
    assert said in last
