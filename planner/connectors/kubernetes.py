"""The ``kubernetes`` connector: scaling decisions set Deployment replicas via the Kubernetes API.

    jetfleet connector kubernetes --model M --namespace jetfleet \\
        --deployment prefill=jetfleet-prefill --deployment decode=jetfleet-decode

Each role of the model maps to one Deployment of one namespace (``--deployment ROLE=NAME``). A
decision is applied by setting ``spec.replicas`` of that Deployment to ``desired_replicas`` less
the workers started by hand (``unmanaged_replicas``: not the Deployment's pods): an absolute
value, never a delta. Kubernetes is level-triggered, so a decision applied twice, or
after someone else changed the count, still converges to what the planner asked for. The write
goes to the Deployment's **scale subresource**, as ``kubectl scale`` sends it::

    PATCH /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale
    Content-Type: application/merge-patch+json
    {"spec": {"replicas": N}}

which needs ``patch`` on ``deployments/scale`` only (the Helm chart's connector Role), not write
access to the Deployment. ``applied`` means the API server accepted the new ``spec.replicas``
(the result's ``replicas`` is the value it returned); the Deployment controller converges after.
On a scale-down the kubelet sends SIGTERM to the pods the controller removes and each worker
drains (stops taking requests, finishes in flight, deregisters, exits) within the pod's
``terminationGracePeriodSeconds`` (``infra/deploy/helm/jetfleet``, ``workers.pools``).

Failures are results, never exceptions: a role without a Deployment, and API errors (status code,
reason and the API's message in ``detail``). 409 Conflict, 429, 5xx and an unreachable API server
are retried ``retries`` times, the delay doubling from ``backoff_s``; 401, 403, 404 and 422 are
not (retrying does not fix them).

``kubernetes_asyncio`` (``pip install 'jetfleet[kubernetes]'``) is imported only when the
connector runs, so the rest of jetfleet and this module's flags do without it.

Credentials (``auth``): ``api-server`` talks to ``api_server`` with an optional bearer ``token``
and ``ca_cert`` (``kubectl proxy`` on http needs neither); ``in-cluster`` uses the pod's service
account; ``kubeconfig`` a kubeconfig file and context. ``auto`` takes the first that applies: an
explicit ``api_server`` (stated intent wins), the pod's service account when
``KUBERNETES_SERVICE_HOST`` is set, then ``kubeconfig`` or ``$KUBECONFIG``/``~/.kube/config``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import structlog
from prometheus_client import CollectorRegistry

from base.connect import close_nats, connect_nats
from base.connection_metrics import ConnectionGauges
from base.ops_http import nats_connected
from base.ops_presence import serve_ops
from base.topology import ensure_topology
from planner.connectors.base import ConnectorService, ScaleResult
from schemas import ScalingDecided, Subjects

log = structlog.get_logger("jetfleet.connector.kubernetes")
T = TypeVar("T")

AuthMode = Literal["auto", "api-server", "in-cluster", "kubeconfig"]
AUTH_MODES: tuple[str, ...] = get_args(AuthMode)
MERGE_PATCH = "application/merge-patch+json"
IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
NO_ANSWER = 0
"""Status of a failure without an HTTP answer (connection refused, timeout)."""

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


@dataclass(frozen=True)
class KubernetesScalerConfig:
    deployments: Mapping[str, str]
    """Role -> name of the Deployment that runs the role's workers, in ``namespace``."""
    namespace: str = "default"
    auth: AuthMode = "auto"
    api_server: str | None = None
    """``https://host:6443``, or ``http://127.0.0.1:8001`` behind ``kubectl proxy``."""
    token: str | None = field(default=None, repr=False)
    """Bearer token for ``api-server`` auth (kept out of reprs and logs)."""
    ca_cert: str | None = None
    """CA bundle file that signed the API server's certificate."""
    insecure_skip_tls_verify: bool = False
    kubeconfig: str | None = None
    context: str | None = None
    """Kubeconfig context (default: the file's current context)."""
    request_timeout_s: float = 10.0
    retries: int = 3
    """Extra attempts after a 409, 429, 5xx or connection error."""
    backoff_s: float = 0.5
    """Delay before the first retry, doubled for each next one."""


# --- pure helpers -----------------------------------------------------------------------------


def parse_deployments(items: Sequence[str]) -> dict[str, str]:
    """``["agg=jetfleet-agg"]`` -> ``{"agg": "jetfleet-agg"}``; ValueError on a bad item."""
    out: dict[str, str] = {}
    for item in items:
        role, sep, name = (part.strip() for part in item.partition("="))
        if not sep or not role or not name:
            raise ValueError(f"expected ROLE=DEPLOYMENT, got {item!r}")
        if not _DNS_SUBDOMAIN.match(name):
            raise ValueError(f"{name!r} is not a valid Deployment name (lowercase DNS subdomain)")
        if out.get(role, name) != name:
            raise ValueError(f"role {role!r} mapped twice ({out[role]!r} and {name!r})")
        out[role] = name
    return out


def resolve_auth(
    cfg: KubernetesScalerConfig, environ: Mapping[str, str], default_kubeconfig_exists: bool
) -> AuthMode:
    """The credential source ``cfg.auth`` stands for (``auto`` resolved); ValueError if none."""
    if cfg.auth == "api-server" and not cfg.api_server:
        raise ValueError("--auth api-server needs --api-server")
    if cfg.auth != "auto":
        return cfg.auth
    if cfg.api_server:
        return "api-server"
    if environ.get(IN_CLUSTER_ENV):
        return "in-cluster"
    if cfg.kubeconfig or default_kubeconfig_exists:
        return "kubeconfig"
    raise ValueError(
        f"no Kubernetes credentials: not in a pod ({IN_CLUSTER_ENV} unset), no kubeconfig"
        " ($KUBECONFIG or ~/.kube/config), no --api-server"
    )


def pick_namespace(flag: str | None, service_account_namespace: str | None) -> str:
    """The ``--namespace`` flag, else the pod's own namespace, else ``default``."""
    for value in (flag, service_account_namespace):
        if value and value.strip():
            return value.strip()
    return "default"


def retryable(status: int) -> bool:
    """Worth another attempt: a conflict, throttling, a server error or no answer at all."""
    return status in (NO_ANSWER, 409, 429) or status >= 500


def api_error_detail(status: int, reason: str, body: bytes | str | None) -> str:
    """``403 Forbidden: <the Status message>`` from an API error answer."""
    message = ""
    if body:
        try:
            parsed = json.loads(body)
        except ValueError:
            message = body.decode(errors="replace") if isinstance(body, bytes) else body
        else:
            if isinstance(parsed, dict):
                message = str(parsed.get("message", ""))
    head = f"{status} {reason}".strip()
    message = " ".join(message.split())[:500]
    return f"{head}: {message}" if message else head


# --- the scaler -------------------------------------------------------------------------------


def _default_kubeconfig_exists() -> bool:
    from kubernetes_asyncio.config.kube_config import KUBE_CONFIG_DEFAULT_LOCATION

    return Path(os.path.expanduser(KUBE_CONFIG_DEFAULT_LOCATION)).exists()


@dataclass(frozen=True)
class ApiFailure:
    status: int
    """HTTP status, or ``NO_ANSWER``."""
    detail: str


async def api_client(cfg: KubernetesScalerConfig, environ: Mapping[str, str]) -> Any:
    """A ``kubernetes_asyncio`` ApiClient for ``cfg``; ValueError/ConfigException if unusable."""
    from kubernetes_asyncio import client as k8s_client
    from kubernetes_asyncio import config as k8s_config

    conf = k8s_client.Configuration()
    mode = resolve_auth(cfg, environ, _default_kubeconfig_exists())
    if mode == "in-cluster":
        k8s_config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
    elif mode == "kubeconfig":
        await k8s_config.load_kube_config(
            config_file=cfg.kubeconfig,
            context=cfg.context,
            client_configuration=conf,
            persist_config=False,
        )
    else:
        assert cfg.api_server is not None  # resolve_auth checked
        conf.host = cfg.api_server.rstrip("/")
        if cfg.token:
            conf.api_key = {"BearerToken": cfg.token}
            conf.api_key_prefix = {"BearerToken": "Bearer"}
        conf.ssl_ca_cert = cfg.ca_cert
    if cfg.insecure_skip_tls_verify:
        conf.verify_ssl = False
    log.info("kubernetes_api", auth=mode, host=conf.host, namespace=cfg.namespace)
    return k8s_client.ApiClient(configuration=conf)


class KubernetesScaler:
    name = "kubernetes"

    def __init__(self, cfg: KubernetesScalerConfig, api: Any) -> None:
        from kubernetes_asyncio.client import AppsV1Api

        self.cfg = cfg
        self.api = api
        self.apps = AppsV1Api(api)

    @classmethod
    async def connect(
        cls, cfg: KubernetesScalerConfig, environ: Mapping[str, str] | None = None
    ) -> KubernetesScaler:
        return cls(cfg, await api_client(cfg, os.environ if environ is None else environ))

    def _where(self, deployment: str) -> str:
        return f"deployment {self.cfg.namespace}/{deployment}"

    async def scale(self, decision: ScalingDecided) -> ScaleResult:
        deployment = self.cfg.deployments.get(decision.role)
        if deployment is None:
            mapped = ", ".join(f"{r}={d}" for r, d in sorted(self.cfg.deployments.items()))
            return ScaleResult(
                False,
                decision.current_replicas,
                f"no Deployment for role {decision.role!r} (mapped: {mapped or 'none'});"
                f" add --deployment {decision.role}=NAME",
            )
        owned = max(decision.desired_replicas - decision.unmanaged_replicas, 0)
        body = {"spec": {"replicas": owned}}
        # _content_type is accepted at run time; the library's stub does not list it
        got = await self._call(
            f"patch {self._where(deployment)}/scale",
            lambda: self.apps.patch_namespaced_deployment_scale(  # type: ignore[call-arg]
                deployment,
                self.cfg.namespace,
                body,
                _content_type=MERGE_PATCH,
                _request_timeout=self.cfg.request_timeout_s,
            ),
        )
        if isinstance(got, ApiFailure):
            return ScaleResult(False, decision.current_replicas, got.detail)
        replicas = int(got.spec.replicas or 0)
        return ScaleResult(
            True,
            replicas,
            f"{self._where(deployment)}: spec.replicas={replicas}"
            f" (status.replicas={got.status.replicas})",
        )

    async def read(self, role: str) -> ScaleResult:
        """The current ``spec.replicas`` of the role's Deployment (a startup check: one try)."""
        deployment = self.cfg.deployments.get(role)
        if deployment is None:
            return ScaleResult(False, 0, f"no Deployment for role {role!r}")
        got = await self._call(
            f"get {self._where(deployment)}/scale",
            lambda: self.apps.read_namespaced_deployment_scale(
                deployment, self.cfg.namespace, _request_timeout=self.cfg.request_timeout_s
            ),
            retries=0,
        )
        if isinstance(got, ApiFailure):
            return ScaleResult(False, 0, got.detail)
        return ScaleResult(True, int(got.spec.replicas or 0), self._where(deployment))

    async def _call(
        self, what: str, call: Callable[[], Awaitable[T]], retries: int | None = None
    ) -> T | ApiFailure:
        """``call()``'s answer, or an ``ApiFailure`` once retries are spent or pointless."""
        from aiohttp import ClientError
        from kubernetes_asyncio.client.exceptions import ApiException

        retries = self.cfg.retries if retries is None else retries
        delay = self.cfg.backoff_s
        attempt = 0
        while True:
            attempt += 1
            try:
                return await call()
            except ApiException as exc:
                status = int(exc.status or NO_ANSWER)
                failure = ApiFailure(
                    status, api_error_detail(status, str(exc.reason or ""), exc.body)
                )
            except (ClientError, OSError, TimeoutError) as exc:
                host = self.api.configuration.host
                reason = f"{type(exc).__name__}: {exc}".rstrip(": ")
                failure = ApiFailure(NO_ANSWER, f"cannot reach the API server {host}: {reason}")
            if not retryable(failure.status) or attempt > retries:
                tries = f", {attempt} attempts" if attempt > 1 else ""
                return ApiFailure(failure.status, f"{failure.detail} ({what}{tries})")
            log.warning("kubernetes_retry", what=what, attempt=attempt, error=failure.detail)
            await asyncio.sleep(delay)
            delay *= 2

    async def close(self) -> None:
        await self.api.close()


# --- the process ------------------------------------------------------------------------------


async def serve_kubernetes_connector(
    nats_url: str,
    subjects: Subjects,
    model: str,
    cfg: KubernetesScalerConfig,
    stop: asyncio.Event,
    ready: asyncio.Event | None = None,
    max_age_s: float = 300.0,
    metrics_port: int = 0,
    metrics_host: str = "127.0.0.1",
) -> None:
    """Apply ``model``'s decisions to the Deployments of ``cfg`` until ``stop`` is set;
    ``metrics_port``: its operations port (/metrics, /health, /ready; 0: none)."""
    scaler = await KubernetesScaler.connect(cfg)
    try:
        for role in sorted(cfg.deployments):
            found = await scaler.read(role)
            if found.ok:
                log.info("deployment_found", role=role, what=found.detail, replicas=found.replicas)
            else:  # not fatal: the API may come back; decisions then report the error
                log.warning("deployment_check_failed", role=role, error=found.detail)
        nc = await connect_nats(nats_url, name=f"connector-kubernetes-{model}")
        registry = CollectorRegistry()
        presence = None
        connections = ConnectionGauges(registry, nc).start()
        try:
            await ensure_topology(nc.jetstream(), subjects)
            presence = await serve_ops(
                nc, subjects, "connector", metrics_port, registry, nats_connected(nc),
                metrics_host, model=model,
            )  # fmt: skip
            service = ConnectorService(
                nc, subjects, model, scaler, max_age_s=max_age_s, registry=registry
            )
            log.info("connector_ready", connector="kubernetes", model=model)
            await service.run(stop, ready)
        finally:
            connections.cancel()
            if presence is not None:
                await presence.stop()
            await close_nats(nc)
    finally:
        await scaler.close()
