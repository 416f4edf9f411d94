"""Decentralized auth with a ``.creds`` file (``JETFLEET_NATS_CREDS``): a nats-server in operator
mode (JWTs as ``nsc`` issues them, ``tests/nats_jwt.py``), a worker and a frontend that connect
with the user's creds and serve a request, and a client without them refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import nats
import pytest

from base.ports import free_port
from base.process import ProcessGroup, wait_http_ok
from infra.command import cli_command
from infra.embedded import EmbeddedNats
from tests.support.clients import run_cli
from tests.support.nats_jwt import operator_setup, write_creds

pytestmark = pytest.mark.integration


async def test_a_fleet_serves_with_creds_files_and_refuses_without(tmp_path: Path) -> None:
    setup = operator_setup()
    server = EmbeddedNats(tmp_path / "nats", extra_config=setup.server_config)
    server.start()
    creds = write_creds(setup, tmp_path / "fleet.creds")
    env = {"JETFLEET_NATS_CREDS": str(creds)}
    group = ProcessGroup(tmp_path / "logs")
    port = free_port()
    try:
        init = await run_cli("infra", "init", "--nats", server.url, env=env)
        assert init.returncode == 0, init.stderr
        group.start("worker", cli_command("worker", "--nats", server.url), env=env)
        frontend = cli_command(
            "frontend", "--nats", server.url, "--router", "round-robin", "--port", str(port)
        )
        group.start("frontend", frontend, env=env)
        base = f"http://127.0.0.1:{port}"
        await asyncio.to_thread(wait_http_ok, f"{base}/ready", 60.0, group)
        async with httpx.AsyncClient(timeout=30) as client:
            r = await client.post(
                f"{base}/v1/completions",
                json={"model": "jetfleet-tiny", "prompt": "signed", "max_tokens": 3},
            )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 3
        with pytest.raises(Exception, match=r"(?i)authorization"):
            await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0)
    finally:
        await asyncio.to_thread(group.stop_all, 20)
        server.stop()
