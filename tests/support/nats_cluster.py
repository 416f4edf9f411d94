"""A 3-node NATS cluster with JetStream on loopback, for tests: three real ``nats-server``
processes with cluster routes, each with its own store (the fleet's streams at R3 survive one)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from base.ports import free_port
from infra.embedded import EmbeddedNats
from tests.support.wait import wait_until


class NatsCluster:
    def __init__(self, tmp: Path, size: int = 3, sync_interval: str | None = None) -> None:
        routes = [free_port() for _ in range(size)]
        self.nodes: list[EmbeddedNats] = []
        for i, port in enumerate(routes):
            others = ", ".join(f'"nats://127.0.0.1:{p}"' for p in routes if p != port)
            cluster = (
                f'server_name: "n{i}"\n'
                f'cluster {{ name: "jf", listen: "127.0.0.1:{port}", routes: [{others}] }}'
            )
            node = EmbeddedNats(
                tmp / f"n{i}", port=free_port(), extra_config=cluster, sync_interval=sync_interval
            )
            self.nodes.append(node)

    @property
    def url(self) -> str:
        return ",".join(n.url for n in self.nodes)

    def start(self) -> None:
        """Start the nodes one after another (in this thread: a server dies with the thread that
        started it, PR_SET_PDEATHSIG), then wait until the cluster's JetStream answers."""
        try:
            for node in self.nodes:
                node.start(timeout_s=60)
            wait_until(self._meta_leader, 60, "a JetStream meta leader elected")
        except BaseException:
            self.stop()
            raise

    def _meta_leader(self) -> str | None:
        node = self.nodes[0]
        with urllib.request.urlopen(f"{node.monitor_url}/jsz", timeout=2) as r:
            meta = json.load(r).get("meta_cluster") or {}
        leader = meta.get("leader")
        return str(leader) if leader and len(meta.get("replicas") or []) >= 2 else None

    def stream_leader(self, stream: str) -> EmbeddedNats:
        """The node that leads ``stream`` (from any node's /jsz monitoring)."""
        for node in self.nodes:
            if not node.pid or node.monitor_url is None:
                continue
            url = f"{node.monitor_url}/jsz?streams=true"
            with urllib.request.urlopen(url, timeout=2) as r:
                info = json.load(r)
            for account in info.get("account_details", []):
                for s in account.get("stream_detail", []):
                    if s["name"] == stream:
                        leader = s["cluster"]["leader"]
                        return next(n for n in self.nodes if f'"{leader}"' in n.extra_config)
        raise LookupError(f"no node reports stream {stream}")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
