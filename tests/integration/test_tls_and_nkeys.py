"""A fleet on secured transports, configured as docs/operating/security.md says: NATS over mutual
TLS with NKey users (``JETFLEET_NATS_TLS_CA``/``_CERT``/``_KEY``, ``JETFLEET_NATS_NKEY_SEED``),
Redis over TLS (``rediss://...?ssl_ca_certs=``). A worker, an indexer and a KV-routing frontend
serve a request; a client without the client certificate or without the NKey is refused.

The CA and certificates are ``trustme``'s throwaway ones. The embedded redis-server is built
without TLS, so Redis's TLS side is a TLS-terminating proxy in this test (as a managed Redis or
stunnel would be); what is tested is the fleet's client side of ``rediss://``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import nats
import nkeys
import pytest
import trustme

from base.ports import free_port
from base.process import ProcessGroup, wait_http_ok
from infra.command import cli_command
from infra.embedded import EmbeddedNats
from tests.support.clients import run_cli

pytestmark = pytest.mark.integration


def _user_nkey() -> tuple[str, bytes]:
    """(public key for the server config, seed file contents for the client)."""
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    return nkeys.from_seed(seed).public_key.decode(), seed


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("jetfleet-component")
    files = {
        "ca": ca.cert_pem,
        "server_cert": server.cert_chain_pems[0],
        "server_key": server.private_key_pem,
        "client_cert": client.cert_chain_pems[0],
        "client_key": client.private_key_pem,
    }
    out = {}
    for name, blob in files.items():
        out[name] = d / f"{name}.pem"
        blob.write_to_path(str(out[name]))
    public, seed = _user_nkey()
    out["seed"] = d / "user.nk"
    out["seed"].write_bytes(seed)
    out["nkey_public"] = d / "user.pub"
    out["nkey_public"].write_text(public)
    return out


@pytest.fixture(scope="module")
def tls_nats(pki: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    config = f"""
tls {{
  cert_file: "{pki["server_cert"]}"
  key_file: "{pki["server_key"]}"
  ca_file: "{pki["ca"]}"
  verify: true
}}
authorization {{ users = [ {{ nkey: {pki["nkey_public"].read_text()} }} ] }}
"""
    server = EmbeddedNats(tmp_path_factory.mktemp("nats-tls"), extra_config=config)
    server.start()
    yield server
    server.stop()


@contextlib.asynccontextmanager
async def tls_proxy(pki: dict[str, Path], target: tuple[str, int]) -> AsyncIterator[int]:
    """TLS in front of a plain TCP server: each connection piped both ways."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki["server_cert"], pki["server_key"])

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(Exception):
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*target)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def test_a_fleet_serves_over_mutual_tls_nkeys_and_rediss(
    pki: dict[str, Path], tls_nats: EmbeddedNats, redis_server, tmp_path: Path
) -> None:
    nats_url = f"tls://127.0.0.1:{tls_nats.port}"
    env = {
        "JETFLEET_NATS_TLS_CA": str(pki["ca"]),
        "JETFLEET_NATS_TLS_CERT": str(pki["client_cert"]),
        "JETFLEET_NATS_TLS_KEY": str(pki["client_key"]),
        "JETFLEET_NATS_NKEY_SEED": str(pki["seed"]),
    }
    group = ProcessGroup(tmp_path)
    port = free_port()
    async with tls_proxy(pki, (redis_server.host, redis_server.port)) as redis_port:
        redis_url = f"rediss://localhost:{redis_port}/0?ssl_ca_certs={pki['ca']}"
        try:
            init = await run_cli("infra", "init", "--nats", nats_url, env=env)
            assert init.returncode == 0, init.stderr
            group.start("worker", cli_command("worker", "--nats", nats_url), env=env)
            group.start(
                "indexer", cli_command("indexer", "--nats", nats_url, "--redis", redis_url), env=env
            )
            frontend = cli_command(
                "frontend", "--nats", nats_url, "--redis", redis_url, "--router", "kv",
                "--port", str(port),
            )  # fmt: skip
            group.start("frontend", frontend, env=env)
            base = f"http://127.0.0.1:{port}"
            await asyncio.to_thread(wait_http_ok, f"{base}/ready", 60.0, group)
            async with httpx.AsyncClient(timeout=30) as client:
                for _ in range(2):  # the second finds the first's blocks through Redis
                    r = await client.post(
                        f"{base}/v1/completions",
                        json={"model": "jetfleet-tiny", "prompt": "secure " * 40, "max_tokens": 3},
                    )
                    assert r.status_code == 200, r.text
                    assert r.json()["usage"]["completion_tokens"] == 3
        finally:
            await asyncio.to_thread(group.stop_all, 20)
        logs = "".join((tmp_path / f"{n}.log").read_text() for n in ("worker", "indexer"))
        assert "Traceback" not in logs

    plain = ssl.create_default_context(cafile=str(pki["ca"]))  # no client certificate
    with pytest.raises(Exception):  # noqa: B017 (refused during the TLS handshake)
        await nats.connect(
            nats_url, tls=plain, nkeys_seed=str(pki["seed"]), allow_reconnect=False,
            max_reconnect_attempts=0, connect_timeout=3,
        )  # fmt: skip
    mutual = ssl.create_default_context(cafile=str(pki["ca"]))
    mutual.load_cert_chain(pki["client_cert"], pki["client_key"])
    with pytest.raises(Exception, match=r"(?i)authorization"):  # TLS, but no NKey
        await nats.connect(
            nats_url, tls=mutual, allow_reconnect=False, max_reconnect_attempts=0,
            connect_timeout=3,
        )  # fmt: skip
