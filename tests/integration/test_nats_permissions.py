"""The per-role NATS users of ``infra/deploy/nats-accounts.conf`` on a real nats-server: a worker
and a frontend each with only their own permissions serve a request, and a role cannot do what
it was not given (a worker publishing scaling decisions, a frontend deleting a stream)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import nats
import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import APIError

from base.ports import free_port
from base.process import ProcessGroup, wait_http_ok
from infra.command import cli_command
from infra.embedded import EmbeddedNats
from infra.tools import infra_init
from schemas import Subjects
from tests.support.clients import run_cli
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

CONF = Path(__file__).resolve().parents[2] / "infra" / "deploy" / "nats-accounts.conf"
ROLES = ("admin", "client", "frontend", "router", "worker", "indexer", "planner", "connector")


def password(role: str) -> str:
    return f"pw-{role}-secret"


@pytest.fixture(scope="module")
def secured_nats(tmp_path_factory):
    text = CONF.read_text()
    for role in ROLES:
        text = text.replace(f"${role.upper()}_PASSWORD", f'"{password(role)}"')
    server = EmbeddedNats(tmp_path_factory.mktemp("nats-auth"), extra_config=text)
    server.start()
    yield server
    server.stop()


def url_for(server: EmbeddedNats, role: str) -> str:
    return f"nats://{role}:{password(role)}@{server.host}:{server.port}"


async def test_roles_serve_within_their_permissions(secured_nats, redis_url, tmp_path) -> None:
    assert await infra_init(url_for(secured_nats, "admin"), Subjects(), 1, quiet=True) == 0
    admin = await nats.connect(url_for(secured_nats, "admin"))
    decisions = await admin.subscribe("fleet.scale.jetfleet-tiny.*")
    group = ProcessGroup(tmp_path)
    port = free_port()
    try:
        group.start(  # its worker runs as the worker user, the connector as its own
            "connector",
            cli_command(
                "connector", "local", "--nats", url_for(secured_nats, "connector"),
                "--worker-nats", url_for(secured_nats, "worker"), "--initial", "agg=1",
                "--speedup", "50", "--log-dir", str(tmp_path / "connector-workers"),
            ),
        )  # fmt: skip
        group.start(
            "router",
            cli_command(
                "router-service", "--nats", url_for(secured_nats, "router"),
                "--router", "round-robin",
            ),
        )  # fmt: skip
        group.start(
            "frontend",
            cli_command(
                "frontend", "--nats", url_for(secured_nats, "frontend"), "--port", str(port),
                "--router", "round-robin",
            ),
        )  # fmt: skip
        group.start(
            "planner",
            cli_command("planner", "--nats", url_for(secured_nats, "planner"), "--interval", "1"),
        )
        group.start(
            "indexer",
            cli_command(
                "indexer", "--nats", url_for(secured_nats, "indexer"), "--redis", redis_url
            ),
        )
        base = f"http://127.0.0.1:{port}"
        await asyncio.to_thread(wait_http_ok, f"{base}/ready", 60.0, group)
        async with httpx.AsyncClient(timeout=30) as client:
            r = await client.post(
                f"{base}/v1/completions",
                json={"model": "jetfleet-tiny", "prompt": "hello", "max_tokens": 5},
            )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 5
        # A NATS-only client through the router service, each with its own user.
        published = await run_cli(
            "publish", "Hello over NATS", "--nats", url_for(secured_nats, "client"),
            "--max-tokens", "4",
        )  # fmt: skip
        assert published.returncode == 0, published.stdout + published.stderr
        assert "finish_reason=length" in published.stdout
        await decisions.next_msg(timeout=10)  # the planner decides with its own permissions
        logs = "".join(
            (tmp_path / f"{name}.log").read_text()
            for name in ("connector", "router", "frontend", "planner", "indexer")
        ) + "".join(p.read_text() for p in (tmp_path / "connector-workers").glob("*.log"))
        assert "permissions violation" not in logs.lower()
        assert "agg-0" in "".join(p.name for p in (tmp_path / "connector-workers").iterdir())
        assert all(c.proc.poll() is None for c in group.children.values())
    finally:
        group.stop_all(timeout_s=20)
        await admin.close()


async def test_a_role_cannot_do_what_it_was_not_given(secured_nats) -> None:
    assert await infra_init(url_for(secured_nats, "admin"), Subjects(), 1, quiet=True) == 0
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    worker = await nats.connect(url_for(secured_nats, "worker"), error_cb=on_error)
    frontend = await nats.connect(url_for(secured_nats, "frontend"), error_cb=on_error)
    try:
        with pytest.raises((NoRespondersError, NatsTimeoutError, APIError)):
            await worker.jetstream().publish("fleet.scale.jetfleet-tiny.agg", b"x", timeout=1)
        with pytest.raises((NoRespondersError, NatsTimeoutError, APIError)):
            await frontend.jetstream().delete_stream("FLEET_REQUESTS")
        info = await worker.jetstream().stream_info("FLEET_REQUESTS")  # reading is allowed
        assert info.config.name == "FLEET_REQUESTS"
        await wait_for(lambda: any("permissions violation" in e.lower() for e in errors), 5)
    finally:
        await worker.close()
        await frontend.close()
    with pytest.raises(Exception, match=r"(?i)authorization"):
        await nats.connect(
            f"nats://worker:wrong@{secured_nats.host}:{secured_nats.port}",
            max_reconnect_attempts=0,
            allow_reconnect=False,
        )
