"""The kubernetes connector between a real nats-server and a local fake of the Kubernetes API.

Decisions go in on NATS; the fake API server (tests/fake_k8s.py) records what the connector
sends; ``ScalingStatus`` comes back on NATS. No real cluster is involved.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from base.topology import ensure_topology
from infra.command import cli_command
from planner.connectors.base import connector_consumer
from planner.connectors.kubernetes import (
    KubernetesScaler,
    KubernetesScalerConfig,
    serve_kubernetes_connector,
)
from schemas import DeadLetter, ScalingDecided, ScalingStatus, Subjects, decode, encode
from tests.support.fake_k8s import FakeKubernetes
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

MODEL = "tiny"
NS = "jetfleet"
TOKEN = "test-token"
ROLES = ("agg", "prefill", "decode")
SCALE_PATH = "/apis/apps/v1/namespaces/jetfleet/deployments/{}/scale"
DONE = ("applied", "failed", "skipped")


def k8s_config(api: FakeKubernetes, **overrides: Any) -> KubernetesScalerConfig:
    settings: dict[str, Any] = {
        "deployments": {"agg": "jf-agg", "prefill": "jf-prefill"},
        "namespace": NS,
        "api_server": api.url,
        "token": TOKEN,
        "retries": 2,
        "backoff_s": 0.01,
        "request_timeout_s": 5.0,
    }
    settings.update(overrides)
    return KubernetesScalerConfig(**settings)


def decision(decision_id: int, current: int, desired: int, **kw: Any) -> ScalingDecided:
    kw.setdefault("role", "agg")
    return ScalingDecided(
        model=MODEL,
        decision_id=decision_id,
        ts_s=time.time(),
        current_replicas=current,
        desired_replicas=desired,
        reasons=("test",),
        **kw,
    )


async def publish(js: Any, subjects: Subjects, d: ScalingDecided) -> None:
    await js.publish(subjects.scale(MODEL, d.role), encode(d))


def of(statuses: list[ScalingStatus], decision_id: int) -> list[ScalingStatus]:
    return [s for s in statuses if s.decision_id == decision_id]


def finished(statuses: list[ScalingStatus], decision_id: int) -> ScalingStatus | None:
    done = [s for s in of(statuses, decision_id) if s.state in DONE]
    return done[-1] if done else None


async def until_finished(statuses: list[ScalingStatus], decision_id: int) -> ScalingStatus:
    result: ScalingStatus = await wait_for(lambda: finished(statuses, decision_id), 5)
    return result


class Connector:
    """``serve_kubernetes_connector`` as a task: ready on enter, stopped on exit."""

    def __init__(self, nats_url: str, subjects: Subjects, cfg: KubernetesScalerConfig) -> None:
        self.args = (nats_url, subjects, MODEL, cfg)
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Connector:
        ready = asyncio.Event()
        self.task = asyncio.create_task(serve_kubernetes_connector(*self.args, self.stop, ready))
        waiter = asyncio.create_task(ready.wait())
        await asyncio.wait({self.task, waiter}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self.task.done():
            self.task.result()  # raise what stopped it
        assert ready.is_set(), "connector not ready"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 10)


@pytest.fixture
async def fake_api() -> AsyncIterator[FakeKubernetes]:
    api = FakeKubernetes(token=TOKEN)
    api.add_deployment(NS, "jf-agg", replicas=1)
    api.add_deployment(NS, "jf-prefill", replicas=1)
    await api.start()
    yield api
    await api.stop()


@pytest.fixture
async def statuses(nc: Any, subjects: Subjects) -> AsyncIterator[list[ScalingStatus]]:
    await ensure_topology(nc.jetstream(), subjects)
    got: list[ScalingStatus] = []

    async def on(msg: Any) -> None:
        got.append(decode(msg.data, ScalingStatus))

    subs = [await nc.subscribe(subjects.scale_status(MODEL, r), cb=on) for r in ROLES]
    yield got
    for sub in subs:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def test_decisions_patch_the_scale_subresource_and_a_restart_does_not_reapply_them(
    nc: Any, nats_url: str, subjects: Subjects, fake_api: FakeKubernetes, statuses: Any
) -> None:
    js = nc.jetstream()
    async with Connector(nats_url, subjects, k8s_config(fake_api)):
        await publish(js, subjects, decision(1, current=1, desired=3))
        up = await until_finished(statuses, 1)
        await publish(js, subjects, decision(2, current=3, desired=1))
        down = await until_finished(statuses, 2)

    assert [s.state for s in of(statuses, 1)] == ["applying", "applied"]
    assert [s.state for s in of(statuses, 2)] == ["applying", "applied"]
    assert (up.replicas, down.replicas) == (3, 1)
    assert up.connector == "kubernetes" and "jetfleet/jf-agg" in up.detail
    writes = fake_api.scale_writes()
    assert [(w.method, w.path) for w in writes] == [("PATCH", SCALE_PATH.format("jf-agg"))] * 2
    assert [w.json() for w in writes] == [{"spec": {"replicas": 3}}, {"spec": {"replicas": 1}}]
    for w in writes:
        assert w.headers["Authorization"] == f"Bearer {TOKEN}"
        assert w.headers["Content-Type"] == "application/merge-patch+json"
    assert fake_api.deployments[(NS, "jf-agg")].replicas == 1
    # the startup check read each mapped Deployment's scale
    reads = {r.path for r in fake_api.requests if r.method == "GET"}
    assert reads == {SCALE_PATH.format("jf-agg"), SCALE_PATH.format("jf-prefill")}

    # restarted with the same durable: the acked decisions 1 and 2 are not applied again
    fake_api.deployments[(NS, "jf-agg")].replicas = 7  # an operator's change since
    async with Connector(nats_url, subjects, k8s_config(fake_api)):
        await publish(js, subjects, decision(3, current=1, desired=2, role="prefill"))
        await until_finished(statuses, 3)

    assert [s.state for s in of(statuses, 1)] == ["applying", "applied"]
    assert [w.path for w in fake_api.scale_writes()[2:]] == [SCALE_PATH.format("jf-prefill")]
    assert fake_api.deployments[(NS, "jf-agg")].replicas == 7


async def test_holds_dry_runs_duplicates_and_undecodable_messages_are_not_applied(
    nc: Any, nats_url: str, subjects: Subjects, fake_api: FakeKubernetes, statuses: Any
) -> None:
    js = nc.jetstream()
    dead: list[DeadLetter] = []

    async def on_dead(msg: Any) -> None:
        dead.append(decode(msg.data, DeadLetter))

    sub = await nc.subscribe(subjects.dlq("connector-kubernetes"), cb=on_dead)
    async with Connector(nats_url, subjects, k8s_config(fake_api)):
        await publish(js, subjects, decision(1, current=2, desired=2))  # hold
        await publish(js, subjects, decision(2, current=1, desired=5, dry_run=True))
        await js.publish(subjects.scale(MODEL, "agg"), b"\x00not msgpack")
        await publish(js, subjects, decision(3, current=1, desired=2))
        applied = await until_finished(statuses, 3)
        await publish(js, subjects, decision(3, current=1, desired=2))  # redelivered
        skipped = await wait_for(lambda: [s for s in of(statuses, 3) if s.state == "skipped"])
        await wait_for(lambda: dead, 5)
    await sub.unsubscribe()

    assert of(statuses, 1) == [] and of(statuses, 2) == []
    assert applied.state == "applied" and applied.replicas == 2
    assert "already applied decision 3" in skipped[0].detail
    assert [s.state for s in of(statuses, 3)] == ["applying", "applied", "skipped"]
    assert [w.json() for w in fake_api.scale_writes()] == [{"spec": {"replicas": 2}}]
    assert dead[0].subject == subjects.scale(MODEL, "agg")
    assert dead[0].payload == b"\x00not msgpack"


async def test_failures_carry_the_reason_and_transient_ones_are_retried(
    nc: Any, nats_url: str, subjects: Subjects, fake_api: FakeKubernetes, statuses: Any
) -> None:
    js = nc.jetstream()
    cfg = k8s_config(fake_api, deployments={"agg": "jf-agg", "prefill": "jf-gone"}, retries=2)
    forbidden = (
        'deployments.apps "jf-agg" is forbidden: User "system:serviceaccount:jetfleet:'
        'jetfleet-planner" cannot patch resource "deployments/scale"'
    )
    async with Connector(nats_url, subjects, cfg):
        await publish(js, subjects, decision(1, current=1, desired=2, role="decode"))
        unmapped = await until_finished(statuses, 1)
        assert fake_api.scale_writes() == []

        fake_api.fail_next(403, message=forbidden)
        await publish(js, subjects, decision(2, current=1, desired=2))
        denied = await until_finished(statuses, 2)

        await publish(js, subjects, decision(3, current=1, desired=2, role="prefill"))
        missing = await until_finished(statuses, 3)
        assert len(fake_api.scale_writes()) == 2  # neither 403 nor 404 is retried

        fake_api.fail_next(409)
        await publish(js, subjects, decision(4, current=1, desired=4))
        conflict_then_ok = await until_finished(statuses, 4)
        assert len(fake_api.scale_writes()) == 2 + 2

        fake_api.fail_next(503, count=3)  # one more than the retries
        await publish(js, subjects, decision(5, current=4, desired=6))
        unavailable = await until_finished(statuses, 5)
        assert len(fake_api.scale_writes()) == 4 + 3

    assert unmapped.state == "failed" and unmapped.replicas == 1
    assert "no Deployment for role 'decode'" in unmapped.detail
    assert "--deployment decode=NAME" in unmapped.detail
    assert denied.state == "failed" and denied.replicas == 1
    assert denied.detail.startswith("403 Forbidden: ") and "cannot patch" in denied.detail
    assert missing.state == "failed"
    assert missing.detail.startswith('404 Not Found: deployments.apps "jf-gone" not found')
    assert conflict_then_ok.state == "applied" and conflict_then_ok.replicas == 4
    assert unavailable.state == "failed" and unavailable.replicas == 4
    assert unavailable.detail.startswith("503 Service Unavailable: injected 503")
    assert "3 attempts" in unavailable.detail
    assert fake_api.deployments[(NS, "jf-agg")].replicas == 4


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_unreachable_api_server_and_wrong_token_are_failed_results(
    fake_api: FakeKubernetes,
) -> None:
    down = k8s_config(fake_api, api_server=f"http://127.0.0.1:{_closed_port()}", retries=1)
    scaler = await KubernetesScaler.connect(down, environ={})
    try:
        result = await scaler.scale(decision(1, current=2, desired=3))
        startup_check = await scaler.read("agg")
    finally:
        await scaler.close()
    assert not result.ok and result.replicas == 2
    assert "cannot reach the API server http://127.0.0.1:" in result.detail
    assert "2 attempts" in result.detail
    assert not startup_check.ok and "cannot reach" in startup_check.detail
    assert "attempts" not in startup_check.detail  # one try: startup is not held up

    scaler = await KubernetesScaler.connect(k8s_config(fake_api, token="wrong"), environ={})
    try:
        result = await scaler.scale(decision(2, current=1, desired=3))
        read = await scaler.read("agg")
    finally:
        await scaler.close()
    assert not result.ok and result.detail.startswith("401 Unauthorized")
    assert not read.ok and read.detail.startswith("401 Unauthorized")
    assert fake_api.requests[0].headers["Authorization"] == "Bearer wrong"
    assert fake_api.deployments[(NS, "jf-agg")].replicas == 1


async def test_cli_process_applies_a_decision_and_stops_on_sigterm(
    nc: Any, nats_url: str, subjects: Subjects, fake_api: FakeKubernetes, tmp_path: Path
) -> None:
    js = nc.jetstream()
    await ensure_topology(js, subjects)
    argv = cli_command(
        "connector",
        "kubernetes",
        "--nats",
        nats_url,
        "--subject-prefix",
        subjects.prefix,
        "--model",
        MODEL,
        "--namespace",
        NS,
        "--deployment",
        "agg=jf-agg",
        "--api-server",
        fake_api.url,
        "--token",
        TOKEN,
    )
    log_path = tmp_path / "connector.log"
    with log_path.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=out)
    try:
        durable = connector_consumer(subjects, MODEL, "kubernetes").durable
        stream = subjects.stream_name("SCALING")

        async def consumer_exists() -> bool:
            try:
                await js.consumer_info(stream, durable)
            except Exception:
                return proc.returncode is not None  # exited: stop waiting, fail below
            return True

        await wait_for(consumer_exists, 8)
        assert proc.returncode is None, log_path.read_text()
        await publish(js, subjects, decision(1, current=1, desired=2))
        await wait_for(lambda: fake_api.deployments[(NS, "jf-agg")].replicas == 2, 5)
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 0, log_path.read_text()


async def test_a_worker_started_by_hand_is_not_counted_into_the_deployment(
    nc: Any, nats_url: str, subjects: Subjects, fake_api: FakeKubernetes, statuses: Any
) -> None:
    """The planner's counts include a worker started by hand; the Deployment's pods do not."""
    js = nc.jetstream()
    async with Connector(nats_url, subjects, k8s_config(fake_api)):
        await publish(js, subjects, decision(1, current=2, desired=4, unmanaged_replicas=1))
        assert (await until_finished(statuses, 1)).replicas == 3
    assert [w.json() for w in fake_api.scale_writes()] == [{"spec": {"replicas": 3}}]
