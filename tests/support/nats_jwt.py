"""Decentralized NATS auth for tests: an operator, an account with JetStream, a system account and
a user, as the JWTs ``nsc`` would issue (nats-io/jwt v2 claims, ed25519-nkey signatures), and the
user's ``.creds`` file. The server trusts the operator and has the accounts preloaded
(``resolver: MEMORY``)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _keypair(prefix: int) -> tuple[Any, bytes]:
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    return nkeys.from_seed(seed), seed


def _jwt(signer: Any, issuer: str, subject: str, name: str, nats: dict[str, Any]) -> str:
    """A JWT signed by ``signer`` (the issuer's key): jti = base32 SHA-512/256 of the claims."""
    claims: dict[str, Any] = {"iss": issuer, "sub": subject, "name": name, "nats": nats}
    claims |= {"iat": int(time.time()), "jti": ""}
    digest = hashlib.new("sha512_256", json.dumps(claims, separators=(",", ":")).encode())
    claims["jti"] = base64.b32encode(digest.digest()).decode().rstrip("=")
    head = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = _b64(json.dumps(claims, separators=(",", ":")).encode())
    return f"{head}.{body}.{_b64(signer.sign(f'{head}.{body}'.encode()))}"


@dataclass(frozen=True)
class OperatorSetup:
    server_config: str  # to append to nats-server's config
    creds: str  # the user's .creds file contents


def operator_setup() -> OperatorSetup:
    op, _ = _keypair(nkeys.PREFIX_BYTE_OPERATOR)
    acc, _ = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    sys_acc, _ = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    user, user_seed = _keypair(nkeys.PREFIX_BYTE_USER)
    opk, acck, sysk, userk = (k.public_key.decode() for k in (op, acc, sys_acc, user))
    unlimited = {"subs": -1, "data": -1, "payload": -1, "conn": -1}
    jetstream = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
    v2 = {"version": 2}
    operator = _jwt(op, opk, opk, "test", {"type": "operator", **v2, "system_account": sysk})
    limits = {**unlimited, **jetstream, "wildcards": True}
    account = _jwt(op, opk, acck, "fleet", {"type": "account", **v2, "limits": limits})
    system = _jwt(op, opk, sysk, "SYS", {"type": "account", **v2, "limits": unlimited})
    rights = {"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1}
    user_jwt = _jwt(acc, acck, userk, "fleet-user", {"type": "user", **v2, **rights})
    config = (
        f"operator: {operator}\nsystem_account: {sysk}\nresolver: MEMORY\n"
        f"resolver_preload: {{\n  {acck}: {account}\n  {sysk}: {system}\n}}\n"
    )
    creds = (
        f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{user_seed.decode()}\n------END USER NKEY SEED------\n"
    )
    return OperatorSetup(config, creds)


def write_creds(setup: OperatorSetup, path: Path) -> Path:
    path.write_text(setup.creds)
    path.chmod(0o600)
    return path
