"""Services' operations ports in ``fleet_ops_endpoints``: put while a service runs, listed by a
frontend's directory, gone on a clean stop; an entry no longer renewed is not listed (an expiry
reaches no watcher)."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from base.ops_presence import OpsDirectory, OpsPresence, advertised_url, ops_key, serve_ops
from base.topology import ensure_topology
from schemas.discovery import OpsEndpoint
from schemas.streams import OPS_BUCKET
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


def _health(url: str) -> dict[str, str]:
    with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
        body: dict[str, str] = json.loads(r.read())
        return body


def test_keys_and_urls() -> None:
    assert ops_key("indexer", "ix-1") == "indexer.ix-1"
    assert ops_key("router", "host a:1/b") == "router.host_a_1_b"
    assert advertised_url("127.0.0.1", 9) == "http://127.0.0.1:9"
    assert not advertised_url("0.0.0.0", 9).startswith("http://0.0.0.0")


def test_the_directory_lists_only_fresh_entries_in_order() -> None:
    d = OpsDirectory(None, None)  # type: ignore[arg-type]  # (no NATS: the pure listing)
    d.endpoints = {
        "b": OpsEndpoint("router", "r1", "http://h:2", at_s=100.0),
        "a": OpsEndpoint("indexer", "i1", "http://h:1", at_s=95.0),
        "c": OpsEndpoint("planner", "p1", "http://h:3", at_s=60.0),  # 40 s old: gone
    }
    assert [e.instance for e in d.live(now_s=100.0)] == ["i1", "r1"]


async def test_a_service_is_listed_while_it_runs_and_not_after(nc, subjects) -> None:
    await ensure_topology(nc.jetstream(), subjects)
    directory = OpsDirectory(nc, subjects)
    await directory.start()
    presence = await serve_ops(
        nc, subjects, "indexer", -1, CollectorRegistry(), lambda: (True, ""), instance="ix-7"
    )
    assert presence is not None
    try:
        await wait_for(lambda: [e.instance for e in directory.live()] == ["ix-7"], timeout=10)
        (listed,) = directory.live()
        assert (await asyncio.to_thread(_health, listed.url))["status"] == "ok"  # it serves
    finally:
        await presence.stop()
    await wait_for(lambda: directory.live() == [], timeout=10)
    await directory.stop()


async def test_an_entry_renewed_is_kept_fresh(nc, subjects) -> None:
    await ensure_topology(nc.jetstream(), subjects)
    presence = OpsPresence(nc, subjects, OpsEndpoint("planner", "p", "http://h:1"), every_s=0.05)
    await presence.start()
    kv = await nc.jetstream().key_value(subjects.bucket_name(OPS_BUCKET))
    first = msgspec.msgpack.decode((await kv.get("planner.p")).value, type=OpsEndpoint)

    async def renewed() -> bool:
        entry = await kv.get("planner.p")
        return msgspec.msgpack.decode(entry.value, type=OpsEndpoint).at_s > first.at_s

    await wait_for(renewed, timeout=5)
    await presence.stop()
