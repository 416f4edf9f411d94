"""A real fleet for end-to-end tests: worker and frontend processes against a real nats-server."""

from __future__ import annotations

import contextlib
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from base.ports import free_port
from base.process import ProcessGroup, wait_http_ok
from infra.command import cli_command
from infra.up import serving


@dataclass
class Fleet:
    nats_url: str
    log_dir: Path
    redis_url: str | None = None
    prefix: str = field(default_factory=lambda: f"e{uuid.uuid4().hex[:8]}")
    port: int = field(default_factory=free_port)
    group: ProcessGroup = field(init=False)
    worker_args: tuple[str, ...] = ("--speedup", "20")
    frontend_args: tuple[str, ...] = ()
    _n: int = 0

    def __post_init__(self) -> None:
        self.group = ProcessGroup(self.log_dir)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def common(self) -> list[str]:
        return ["--nats", self.nats_url, "--subject-prefix", self.prefix, "--log-level", "info"]

    def add_worker(self, *extra: str) -> str:
        name = f"worker-{self._n}"
        self._n += 1
        worker_id = f"{self.prefix}-{name}"
        self.group.start(
            name,
            cli_command(
                "worker", *self.common(), "--worker-id", worker_id, *self.worker_args, *extra
            ),
        )
        return worker_id

    def add_replicas(self, replicas: int, *extra: str) -> tuple[str, list[str]]:
        """One worker process running ``replicas`` workers (``--replicas``): its process name
        and the worker ids it registers."""
        name = f"worker-{self._n}"
        self._n += 1
        base = f"{self.prefix}-{name}"
        argv = cli_command(
            "worker", *self.common(), "--worker-id", base, "--replicas", str(replicas),
            *self.worker_args, *extra,
        )  # fmt: skip
        self.group.start(name, argv)
        return name, [f"{base}-{i}" for i in range(replicas)]

    def redis_args(self) -> list[str]:
        return ["--redis", self.redis_url] if self.redis_url else []

    def start_frontend(
        self,
        *extra: str,
        name: str = "frontend",
        port: int | None = None,
        serving_first: bool = True,
    ) -> str:
        """Start a frontend and wait until it serves a model (``serving_first=False``: until it
        answers at all)."""
        port = port or self.port
        argv = cli_command(
            "frontend",
            *self.common(),
            *self.redis_args(),
            "--port",
            str(port),
            *self.frontend_args,
            *extra,
        )
        self.group.start(name, argv)
        url = f"http://127.0.0.1:{port}"
        if serving_first:
            wait_http_ok(f"{url}/ready", 60.0, self.group, until=serving)
        else:
            wait_http_ok(f"{url}/health", 60.0, self.group)
        return url

    def start_router_service(self, *extra: str) -> None:
        argv = cli_command("router-service", *self.common(), *self.redis_args(), *extra)
        self.group.start("router", argv)

    def start_indexer(self, name: str = "indexer") -> None:
        self.group.start(name, cli_command("indexer", *self.common(), *self.redis_args()))

    def kill(self, worker_id: str) -> None:
        name = worker_id.removeprefix(f"{self.prefix}-")
        child = self.group.children.pop(name)
        child.proc.send_signal(signal.SIGKILL)
        child.proc.wait()

    def terminate(self, worker_id: str) -> int | None:
        return self.group.stop(worker_id.removeprefix(f"{self.prefix}-"))

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    async def ready_workers(self) -> dict[str, dict[str, Any]]:
        """The workers registered as ready, by id, as ``jetfleet status`` reads them (none yet
        before the first worker made the registrations bucket)."""
        registered = await self.registered_workers()
        return {w: row for w, row in registered.items() if row["status"] == "ready"}

    async def registered_workers(self) -> dict[str, dict[str, Any]]:
        """Every registration (ready, draining, expired), by worker id."""
        from base.connect import connect_nats
        from infra.tools import NoFleetError, fleet_status
        from schemas import Subjects

        nc = await connect_nats(self.nats_url, name="test-status")
        try:
            report = await fleet_status(nc, Subjects(self.prefix))
        except NoFleetError:  # the first component is still making the fleet's buckets
            return {}
        finally:
            await nc.close()
        return {w["worker_id"]: w for w in report["workers"]}

    def stop(self) -> None:
        self.group.stop_all(timeout_s=20)


@contextlib.contextmanager
def kv_fleet(
    nats_url: str, log_dir: Path, redis_url: str, *frontend_args: str, workers: int = 1
) -> Iterator[Fleet]:
    """``workers`` mocker workers, an indexer and a ``kv`` frontend (plus ``frontend_args``) on
    ``redis_url``, stopped at the end."""
    f = Fleet(nats_url, log_dir, redis_url=redis_url)
    try:
        for _ in range(workers):
            f.add_worker()
        f.start_indexer()
        f.start_frontend("--router", "kv", *frontend_args)
        yield f
    finally:
        f.stop()
