"""``jetfleet connector local``: run the local connector as a process.

    jetfleet connector local --model jetfleet-tiny --initial agg=2 [worker engine flags...]

Starts ``--initial`` workers per role, then applies the model's scaling decisions until SIGTERM
or SIGINT, and finally drains every worker it started.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path

import structlog

from infra.jetstream import close_nats, connect_nats, ensure_topology
from planner.connectors.base import ConnectorService
from planner.connectors.local import LocalScaler, LocalScalerConfig
from planner.fleet_watch import WorkerWatch
from schemas import Subjects

log = structlog.get_logger("jetfleet.connector")


async def run_local_connector(
    nats_url: str,
    subjects: Subjects,
    model: str,
    scaler_cfg: LocalScalerConfig,
    initial: dict[str, int],
) -> int:
    nc = await connect_nats(nats_url, name=f"connector-local-{model}")
    await ensure_topology(nc.jetstream(), subjects)
    watch = WorkerWatch(nc, subjects)
    await watch.start()
    scaler = LocalScaler(scaler_cfg, watch)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    code = 0
    try:
        for role, count in sorted(initial.items()):
            if count > 0:
                result = await scaler.start_workers(role, count)
                log.info("initial_workers", role=role, ok=result.ok, detail=result.detail)
                if not result.ok:
                    code = 1
                    return code
        service = ConnectorService(nc, subjects, model, scaler)
        log.info("connector_ready", connector="local", model=model)
        await service.run(stop)
    finally:
        await scaler.close()
        await watch.stop()
        await close_nats(nc)
    return code


def local_config(
    nats_url: str, prefix: str, log_dir: str, worker_args: list[str], log_level: str
) -> LocalScalerConfig:
    return LocalScalerConfig(
        nats_url=nats_url,
        subject_prefix=prefix,
        log_dir=Path(log_dir),
        worker_args=tuple(worker_args),
        log_level=log_level,
        id_prefix=f"local-{uuid.uuid4().hex[:4]}",  # several connectors may share a fleet
    )
