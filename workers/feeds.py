"""What the workers of one process share on their NATS connection.

A worker process usually runs one worker; ``jetfleet worker --replicas N`` runs N on one
connection. Each worker keeps everything the wire sees of it (its id, its own request consumer,
its registration and heartbeat, its KV events, load reports, token streams and control subject),
but three things belong to the connection, not the worker, and are held once per process:

- ``cancels``: the one ``fleet.cancel.*`` subscription (``workers.cancels``);
- ``probe``: the PING of the fence (``workers.fence.ConnectionProbe``);
- ``pool``: the pull loop of the pool consumer (``workers.pool``).

A worker built without them (``WorkerRuntime(..., feeds=None)``) gets feeds of its own, so a
process of one worker is on the wire exactly what it always was.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.aio.client import Client as NATS

from base.deadletter import UNCOUNTED, DeadLetterMetrics
from workers.cancels import CancelFeed
from workers.config import WorkerConfig
from workers.fence import ConnectionProbe
from workers.pool import PoolFeed


@dataclass(frozen=True)
class ProcessFeeds:
    cancels: CancelFeed
    probe: ConnectionProbe
    pool: PoolFeed

    @classmethod
    def for_connection(
        cls, nc: NATS, cfg: WorkerConfig, dead_letters: DeadLetterMetrics = UNCOUNTED
    ) -> ProcessFeeds:
        """The feeds of the workers ``cfg`` describes (one model and role) on ``nc``
        (``dead_letters``: where the cancel feed counts what it gives up on)."""
        return cls(
            CancelFeed(nc, cfg.subjects, dead_letters),
            ConnectionProbe(nc, cfg.ttl_s),
            PoolFeed(nc.jetstream(), cfg.subjects, cfg.model_name, cfg.role),
        )
