"""Helpers of the real-engine tests: vLLM's processes as /proc shows them, control ops."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
from nats.aio.client import Client as NATS

from schemas import Subjects
from schemas.control import ControlReply, ControlRequest
from workers.engines.vllm.cpu_list import parse_cpu_list
from workers.engines.vllm.lifeline import OWNER_ENV


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def cores_of(pid: int, tid: int | None = None) -> frozenset[int]:
    """The cores a process (or one of its threads) may run on."""
    path = f"/proc/{pid}/task/{tid}/status" if tid else f"/proc/{pid}/status"
    for line in Path(path).read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return parse_cpu_list(line.split(":", 1)[1])
    raise AssertionError(f"no Cpus_allowed_list in {path}")


def alive(pid: int) -> bool:
    """Running (a zombie has ended; this sandbox's init may never reap it)."""
    state = _state(pid)
    return state is not None and state != "Z"


def _owner(pid: int) -> int | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    key = OWNER_ENV.encode() + b"="
    for item in environ:
        if item.startswith(key):
            return int(item[len(key) :])
    return None


def engine_processes(owner: int | None = None) -> list[int]:
    """Live processes vLLM started under a jetfleet worker (``owner``: under that worker), the
    worker itself excluded; with no ``owner``, only those whose worker is gone (orphans)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or not alive(pid := int(entry)):
            continue
        mine = _owner(pid)
        if mine is None or mine == pid:
            continue
        if (owner is None and not alive(mine)) or mine == owner:
            found.append(pid)
    return found


def title(pid: int) -> str:
    """The process's title (vLLM names its processes ``VLLM::EngineCore``, ``VLLM::Worker``)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


async def control(
    nc: NATS, worker_id: str, op: str, timeout_s: float = 60.0, **args: str
) -> ControlReply:
    """One control op on a worker, as ``fleet.ctl.{worker}.{op}`` carries it."""
    msg = await nc.request(
        Subjects().ctl(worker_id, op), msgspec.msgpack.encode(ControlRequest(args=args)), timeout_s
    )
    return msgspec.msgpack.decode(msg.data, type=ControlReply)
