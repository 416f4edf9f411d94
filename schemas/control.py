"""Control plane: core-NATS request/reply on fleet.ctl.{worker}.{op}, and dead letters."""

from __future__ import annotations

from typing import Literal

import msgspec

ControlOp = Literal[
    "health",
    "sleep",
    "wake",
    "clear_kv",
    "kv_resync",
    "drain",
    "lora_load",
    "lora_unload",
    "lora_list",
    "kv_release",
]
CONTROL_OPS: tuple[str, ...] = (
    "health",
    "sleep",
    "wake",
    "clear_kv",
    "kv_resync",  # a KV indexer lost track of this worker: publish the whole cache again
    "drain",
    "lora_load",
    "lora_unload",
    "lora_list",
    "kv_release",  # a decode worker pulled a remote prefill's KV: the prefill side frees it
)


class ControlRequest(msgspec.Struct, frozen=True, omit_defaults=True):
    args: dict[str, str] = {}
    v: int = 1


def kv_release(request_id: str) -> ControlRequest:
    """``kv_release``: the blocks a prefill worker holds for ``request_id`` (a remote prefill)
    may go, because the decode worker pulled them or none will."""
    return ControlRequest(args={"request_id": request_id})


class ControlReply(msgspec.Struct, frozen=True, omit_defaults=True):
    ok: bool
    detail: str = ""
    data: dict[str, object] = {}
    v: int = 1


class DeadLetter(msgspec.Struct, frozen=True, omit_defaults=True):
    """A message a consumer could not decode or process, moved aside with the reason."""

    component: str  # who gave up on it
    subject: str  # where it was received
    reason: str
    ts_s: float
    payload: bytes = b""
    headers: dict[str, str] = {}
    v: int = 1
