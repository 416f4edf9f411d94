"""One worker of a worker process: its engine, registration and runtime, from start to drained.

A process runs one worker, or N of them (``jetfleet worker --replicas N``, ``workers.main``).
Each is a whole worker on the wire (its own id, request consumer, registration and heartbeat, KV
events, load reports, token streams and control subject); what they share is the process's
(connection, tokenizer, metrics registry, tracing, ``workers.feeds``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog

from workers.config import WorkerConfig
from workers.engine import Engine
from workers.registry import Registry
from workers.runtime import WorkerRuntime

log = structlog.get_logger("jetfleet.worker")


@dataclass(frozen=True)
class Replica:
    cfg: WorkerConfig
    engine: Engine
    registry: Registry
    runtime: WorkerRuntime

    @property
    def worker_id(self) -> str:
        return self.cfg.worker_id

    @property
    def serving(self) -> bool:
        """Registered ready and not asked to stop."""
        return self.registry.status == "ready" and not self.registry.stop_requested.is_set()

    def request_stop(self) -> None:
        self.registry.request_stop()

    async def serve(self, on_engine_failed: Callable[[], None]) -> None:
        """Until its stop is requested (a signal, a ``drain`` control op, its engine dying), then
        drain and deregister. ``on_engine_failed``: called first if its engine died."""
        try:
            await self.registry.stop_requested.wait()
            if self.runtime.failure is not None:
                on_engine_failed()
        finally:
            await self.runtime.drain_and_stop()  # after an engine failure: deregistered first
            log.info("worker_drained", worker_id=self.worker_id)
            await self.registry.deregister()
