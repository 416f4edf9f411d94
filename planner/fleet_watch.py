"""The planner's view of discovery: how many ready workers each (model, role) has right now.

A watcher of the workers bucket (no model cards or tokenizers: the planner needs counts only).
A worker counts while its heartbeat is fresh and its status is ``ready``; a draining worker is
already on its way out and does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import structlog

from schemas import Subjects, WireDecodeError, WorkerRegistration, decode
from schemas.streams import WORKERS_BUCKET

log = structlog.get_logger("jetfleet.planner")


def ready_counts(
    regs: dict[str, WorkerRegistration], model: str, roles: tuple[str, ...], now_s: float
) -> dict[str, int]:
    """Ready workers with a fresh heartbeat per role of ``model`` (every role in ``roles``)."""
    counts = dict.fromkeys(roles, 0)
    for reg in regs.values():
        fresh = now_s - reg.heartbeat_at_s <= reg.ttl_s
        if reg.model == model and reg.status == "ready" and fresh and reg.role in counts:
            counts[reg.role] += 1
    return counts


class WorkerWatch:
    def __init__(self, nc: Any, subjects: Subjects) -> None:
        self.js = nc.jetstream()
        self.subjects = subjects
        self.regs: dict[str, WorkerRegistration] = {}
        self.synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._watcher: Any = None

    async def start(self) -> None:
        kv = await self.js.key_value(self.subjects.bucket_name(WORKERS_BUCKET))
        self._watcher = await kv.watchall()
        self._task = asyncio.create_task(self._watch())
        await self.synced.wait()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._watcher is not None:
            with contextlib.suppress(Exception):
                await self._watcher.stop()

    def counts(self, model: str, roles: tuple[str, ...]) -> dict[str, int]:
        return ready_counts(self.regs, model, roles, time.time())

    async def _watch(self) -> None:
        async for entry in self._watcher:
            if entry is None:
                self.synced.set()
                continue
            if entry.operation in ("DEL", "PURGE") or not entry.value:
                self.regs.pop(entry.key, None)
                continue
            try:
                self.regs[entry.key] = decode(entry.value, WorkerRegistration)
            except WireDecodeError as exc:
                log.warning("bad_registration", key=entry.key, error=str(exc))
