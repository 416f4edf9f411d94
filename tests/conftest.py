"""Session fixtures: a real nats-server (JetStream) and a real redis-server, own ports and dirs."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from infra.embedded import EmbeddedNats, EmbeddedRedis
from infra.jetstream import connect_nats
from schemas import Subjects


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(tmp_path_factory.mktemp("nats"), port=0)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), port=0)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def nats_url(nats_server: EmbeddedNats) -> str:
    return nats_server.url


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
    return redis_server.url


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[object]:
    client = await connect_nats(nats_url, name="test")
    yield client
    await client.close()


@pytest.fixture
def fleet_prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


@pytest.fixture
def subjects(fleet_prefix: str) -> Subjects:
    return Subjects(fleet_prefix)
