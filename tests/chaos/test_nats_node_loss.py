"""Chaos: ``jetfleet up --nats <3-node cluster> --replicas 3`` loses a NATS node under load.

The node killed (SIGKILL) is the leader of the requests stream, the worst one to lose: every
process connected to it reconnects to another node, the stream elects a new leader, and no
request a client sent is lost: every one is answered in full. The fast variant runs in the
default suite; ``-m slow`` runs the long one. Each prints its figures.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from base.connect import connect_nats
from schemas import Subjects
from schemas.streams import fleet_topology
from tests.support.nats_cluster import NatsCluster
from tests.support.up import running_up
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("requests", "concurrency"),
    [pytest.param(160, 8, id="fast"), pytest.param(2000, 16, id="long", marks=pytest.mark.slow)],
)
async def test_a_nats_node_killed_under_load_loses_no_request(
    tmp_path, requests: int, concurrency: int
) -> None:
    cluster = NatsCluster(tmp_path / "nats")
    cluster.start()
    results: list[tuple[int, int, float]] = []  # status, completion tokens, seconds
    try:
        with running_up(tmp_path, 2, "--nats", cluster.url, "--replicas", "3") as up:
            url = f"{up.base_url}/v1/completions"
            # up created every stream at R3, and the components it started kept that
            nc = await connect_nats(cluster.url, name="test-replicas")
            try:
                mine = await nc.jetstream().streams_info()
                topo = fleet_topology(Subjects())
                every = len(topo.streams) + len(topo.buckets) + len(topo.object_stores)
                assert len(mine) == every and {i.config.num_replicas for i in mine} == {3}, [
                    (i.config.name, i.config.num_replicas) for i in mine
                ]
            finally:
                await nc.close()
            sent = 0

            async def client_loop(http: httpx.AsyncClient) -> None:
                nonlocal sent
                while sent < requests:
                    sent += 1
                    body = {"model": "jetfleet-tiny", "prompt": f"chaos {sent}", "max_tokens": 16}
                    t0 = time.monotonic()
                    r = await http.post(url, json=body)
                    tokens = r.json()["usage"]["completion_tokens"] if r.status_code == 200 else 0
                    results.append((r.status_code, tokens, time.monotonic() - t0))

            async with httpx.AsyncClient(timeout=120) as http:
                loops = [asyncio.create_task(client_loop(http)) for _ in range(concurrency)]
                await wait_for(lambda: len(results) >= requests // 4, timeout=60)
                leader = cluster.stream_leader(up.subjects.stream_name("REQUESTS"))
                assert leader.proc is not None
                leader.proc.kill()
                killed_at = len(results)
                await asyncio.gather(*loops)
        failed = [(s, n) for s, n, _ in results if s != 200 or n != 16]
        slowest = max(t for _, _, t in results)
        print(
            f"\nNATS node loss under jetfleet up: {len(results)} requests at c={concurrency}, the "
            f"requests stream's leader killed after {killed_at}; {len(failed)} not answered in "
            f"full; slowest {slowest:.2f}s"
        )
        assert len(results) == requests
        assert not failed, failed[:10]
    finally:
        cluster.stop()
