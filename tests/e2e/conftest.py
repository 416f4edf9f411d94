from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.support.clients import openai_client
from tests.support.fleet import Fleet


@pytest.fixture(scope="module")
def fleet(nats_server, tmp_path_factory) -> Iterator[Fleet]:
    """Two mocker workers (speedup 20) and a round-robin frontend, shared by a test module."""
    f = Fleet(nats_server.url, tmp_path_factory.mktemp("fleet-logs"))
    try:
        f.add_worker()
        f.add_worker()
        f.start_frontend("--router", "round-robin")
        yield f
    finally:
        f.stop()


@pytest.fixture
def client(fleet: Fleet) -> openai.OpenAI:
    """The official OpenAI client on ``fleet`` (a module's own ``fleet`` fixture, if it has one)."""
    return openai_client(fleet.base_url)
