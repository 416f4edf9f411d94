"""The connector processes: ``jetfleet connector local`` and ``jetfleet connector kubernetes``.

    jetfleet connector local --model jetfleet-tiny --initial agg=2 [worker engine flags...]

starts ``--initial`` workers per role, then applies the model's scaling decisions until SIGTERM
or SIGINT, and finally drains every worker it started. ``connector kubernetes`` applies them to
Deployments (``planner.connectors.kubernetes``).
"""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path

import structlog
from prometheus_client import CollectorRegistry

from base.connect import close_nats, connect_nats
from base.connection_metrics import ConnectionGauges
from base.ops_http import nats_connected
from base.ops_presence import serve_ops
from base.signals import stop_event
from base.topology import ensure_topology
from base.worker_watch import WorkerWatch
from infra.command import cli_command
from planner.connectors.base import ConnectorService
from planner.connectors.kubernetes import (
    AUTH_MODES,
    SERVICE_ACCOUNT_DIR,
    KubernetesScalerConfig,
    parse_deployments,
    pick_namespace,
    serve_kubernetes_connector,
)
from planner.connectors.local import LocalScaler, LocalScalerConfig
from schemas import Subjects
from workers.engines.vllm.cpu_list import parse_cpu_list

log = structlog.get_logger("jetfleet.connector")


async def run_local_connector(
    nats_url: str,
    subjects: Subjects,
    model: str,
    scaler_cfg: LocalScalerConfig,
    initial: dict[str, int],
    metrics_port: int = 0,
    metrics_host: str = "127.0.0.1",
) -> int:
    """``metrics_port``: its operations port (/metrics, /health, /ready; 0: none)."""
    nc = await connect_nats(nats_url, name=f"connector-local-{model}")
    await ensure_topology(nc.jetstream(), subjects)
    registry = CollectorRegistry()
    presence = await serve_ops(
        nc, subjects, "connector", metrics_port, registry, nats_connected(nc), metrics_host,
        model=model,
    )  # fmt: skip
    connections = ConnectionGauges(registry, nc).start()
    watch = WorkerWatch(nc, subjects)
    await watch.start()
    scaler = LocalScaler(scaler_cfg, watch)
    stop = stop_event()
    code = 0
    try:
        for role, count in sorted(initial.items()):
            if count > 0:
                result = await scaler.start_workers(role, count)
                log.info("initial_workers", role=role, ok=result.ok, detail=result.detail)
                if not result.ok:
                    code = 1
                    return code
        service = ConnectorService(nc, subjects, model, scaler, registry=registry)
        log.info("connector_ready", connector="local", model=model)
        await service.run(stop)
    finally:
        if presence is not None:
            await presence.stop()
        connections.cancel()
        await scaler.close()
        await watch.stop()
        await close_nats(nc)
    return code


def local_config(
    nats_url: str,
    prefix: str,
    log_dir: str,
    worker_args: list[str],
    log_level: str,
    start_timeout_s: float,
    cpu_sets: list[str] | None = None,
) -> LocalScalerConfig:
    """``nats_url``: the URL the started workers connect with (``--worker-nats``);
    ``cpu_sets``: the cores a worker may be given (``--worker-cores``)."""
    for cores in cpu_sets or []:
        parse_cpu_list(cores)  # a bad list is refused here, not by every worker it starts
    return LocalScalerConfig(
        cpu_sets=tuple(cpu_sets or ()),
        start_timeout_s=start_timeout_s,
        nats_url=nats_url,
        worker_command=tuple(cli_command("worker")),
        subject_prefix=prefix,
        log_dir=Path(log_dir),
        worker_args=tuple(worker_args),
        log_level=log_level,
        id_prefix=f"local-{uuid.uuid4().hex[:4]}",  # several connectors may share a fleet
    )


def add_kubernetes_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``jetfleet connector kubernetes`` (the NATS flags come from the common set)."""
    p.add_argument(
        "--model", default="jetfleet-tiny", help="served model whose decisions to act on"
    )
    p.add_argument(
        "--deployment",
        action="append",
        default=[],
        required=True,
        metavar="ROLE=NAME",
        help="Deployment running a role's workers (repeat per role)",
    )
    p.add_argument(
        "--namespace", default=None, help="default: the pod's own namespace, else 'default'"
    )
    p.add_argument("--auth", choices=AUTH_MODES, default="auto", help="credential source")
    p.add_argument("--api-server", default=None, help="API server URL (wins over auto-detection)")
    p.add_argument("--token", default=None, help="bearer token for --api-server")
    p.add_argument("--token-file", default=None, help="file holding the bearer token")
    p.add_argument("--ca-cert", default=None, help="CA bundle of the API server's certificate")
    p.add_argument(
        "--insecure-skip-tls-verify",
        action="store_true",
        help="do not check the API server's certificate (testing only)",
    )
    p.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG or ~/.kube/config")
    p.add_argument("--context", default=None, help="kubeconfig context")
    p.add_argument("--request-timeout", type=float, default=10.0, help="seconds per API call")
    p.add_argument("--retries", type=int, default=3, help="retries of a 409/429/5xx/no answer")
    p.add_argument(
        "--max-age", type=float, default=300.0, help="skip decisions older than this (seconds)"
    )


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def config_from_args(
    args: argparse.Namespace, service_account_dir: Path = SERVICE_ACCOUNT_DIR
) -> KubernetesScalerConfig:
    """The scaler config of parsed ``add_kubernetes_args`` flags; ValueError if inconsistent."""
    token = args.token
    if args.token_file:
        text = _read_text(Path(args.token_file))
        if text is None or not text.strip():
            raise ValueError(f"cannot read a token from {args.token_file}")
        token = text.strip()
    if args.retries < 0 or args.request_timeout <= 0:
        raise ValueError("--retries must be >= 0 and --request-timeout > 0")
    return KubernetesScalerConfig(
        deployments=parse_deployments(args.deployment),
        namespace=pick_namespace(args.namespace, _read_text(service_account_dir / "namespace")),
        auth=args.auth,
        api_server=args.api_server,
        token=token,
        ca_cert=args.ca_cert,
        insecure_skip_tls_verify=args.insecure_skip_tls_verify,
        kubeconfig=args.kubeconfig,
        context=args.context,
        request_timeout_s=args.request_timeout,
        retries=args.retries,
    )


async def _serve_until_signal(
    args: argparse.Namespace, subjects: Subjects, cfg: KubernetesScalerConfig
) -> int:
    from kubernetes_asyncio.config import ConfigException

    stop = stop_event()
    try:
        await serve_kubernetes_connector(
            args.nats, subjects, args.model, cfg, stop, max_age_s=args.max_age,
            metrics_port=args.metrics_port, metrics_host=args.metrics_host,
        )  # fmt: skip
    except (ValueError, ConfigException) as exc:
        print(f"jetfleet connector kubernetes: {exc}", file=sys.stderr)
        return 2
    return 0


def run_kubernetes_connector(args: argparse.Namespace, subjects: Subjects) -> int:
    """``jetfleet connector kubernetes``: apply decisions until SIGTERM or SIGINT.

    In a pod (its own service account; the Helm chart infra/deploy/helm/jetfleet runs it so)::

        jetfleet connector kubernetes --nats nats://nats:4222 --model jetfleet-tiny \\
            --namespace jetfleet --deployment agg=jetfleet-worker-agg

    From a workstation, through ``kubectl proxy`` or with a token::

        jetfleet connector kubernetes --model jetfleet-tiny --deployment agg=jetfleet-agg \\
            --api-server https://10.0.0.1:6443 --token-file ./token --ca-cert ./ca.crt

    Exit status 0 after a signal, 2 for unusable flags or credentials.
    """
    try:
        import kubernetes_asyncio  # noqa: F401
    except ImportError:
        print(
            "jetfleet connector kubernetes needs kubernetes_asyncio:"
            " pip install 'jetfleet[kubernetes]'",
            file=sys.stderr,
        )
        return 2
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        print(f"jetfleet connector kubernetes: {exc}", file=sys.stderr)
        return 2
    import uvloop

    return int(uvloop.run(_serve_until_signal(args, subjects, cfg)))
