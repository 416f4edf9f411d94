"""A local fake of the part of the Kubernetes API the ``kubernetes`` connector uses.

    GET   /apis/apps/v1/namespaces/{ns}/deployments/{name}          apps/v1 Deployment
    GET   /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale    autoscaling/v1 Scale
    PATCH /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale    merge, strategic-merge or
                                                                    JSON patch of the Scale
    PUT   /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale    a whole Scale

Errors are ``Status`` objects as the real API server sends them: 401 without the expected bearer
token, 404 for an unknown Deployment or path, 415 for another content type, 422 for replicas that
are not a non-negative integer, 409 for a PUT with a stale ``metadata.resourceVersion``.
``fail_next(status, n)`` makes the next ``n`` authenticated requests answer ``status``. Every
request is recorded (method, path, headers, body) in ``requests``.

What it is not: no controller runs (``status.replicas`` stays where the test put it), and a
strategic-merge patch is applied as a JSON merge patch (the same thing for a Scale, which has
no lists).
"""

from __future__ import annotations

import json
import socket
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

PREFIX = "/apis/apps/v1/namespaces/{ns}/deployments/{name}"
MERGE_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")
JSON_PATCH = "application/json-patch+json"
REASONS = {
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class FakeDeployment:
    namespace: str
    name: str
    replicas: int
    status_replicas: int
    resource_version: int = 1


@dataclass
class _Failure:
    status: int
    message: str


@dataclass
class FakeKubernetes:
    token: str = "test-token"
    deployments: dict[tuple[str, str], FakeDeployment] = field(default_factory=dict)
    requests: list[RecordedRequest] = field(default_factory=list)
    _failures: deque[_Failure] = field(default_factory=deque)
    _runner: web.AppRunner | None = None
    url: str = ""

    def add_deployment(self, namespace: str, name: str, replicas: int = 1) -> FakeDeployment:
        dep = FakeDeployment(namespace, name, replicas, replicas)
        self.deployments[(namespace, name)] = dep
        return dep

    def fail_next(self, status: int, count: int = 1, message: str = "") -> None:
        for _ in range(count):
            self._failures.append(_Failure(status, message or f"injected {status}"))

    def scale_writes(self) -> list[RecordedRequest]:
        """The PATCH and PUT requests to any scale subresource, in order."""
        return [
            r for r in self.requests if r.method in ("PATCH", "PUT") and r.path.endswith("/scale")
        ]

    # --- server ---------------------------------------------------------------------------------

    async def start(self) -> str:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_get(PREFIX, self._get_deployment)
        app.router.add_get(PREFIX + "/scale", self._get_scale)
        app.router.add_patch(PREFIX + "/scale", self._patch_scale)
        app.router.add_put(PREFIX + "/scale", self._put_scale)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        site = web.SockSite(self._runner, sock)
        await site.start()
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(
            RecordedRequest(request.method, request.path, dict(request.headers), body)
        )
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return status_response(401, "Unauthorized")
        if self._failures:
            failure = self._failures.popleft()
            return status_response(failure.status, failure.message)
        try:
            response: web.StreamResponse = await handler(request)
        except web.HTTPNotFound:
            return status_response(404, f"the server could not find {request.path}")
        return response

    # --- handlers -------------------------------------------------------------------------------

    def _find(self, request: web.Request) -> FakeDeployment | None:
        return self.deployments.get((request.match_info["ns"], request.match_info["name"]))

    async def _get_deployment(self, request: web.Request) -> web.Response:
        dep = self._find(request)
        if dep is None:
            return not_found(request)
        return web.json_response(deployment_object(dep))

    async def _get_scale(self, request: web.Request) -> web.Response:
        dep = self._find(request)
        if dep is None:
            return not_found(request)
        return web.json_response(scale_object(dep))

    async def _patch_scale(self, request: web.Request) -> web.Response:
        dep = self._find(request)
        if dep is None:
            return not_found(request)
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
        try:
            patch = json.loads(await request.read())
        except ValueError as exc:
            return status_response(400, f"invalid JSON: {exc}")
        if content_type in MERGE_TYPES:
            patched = merge_patch(scale_object(dep), patch)
        elif content_type == JSON_PATCH:
            patched = json_patch_replicas(scale_object(dep), patch)
            if patched is None:
                return status_response(422, "only replace/add of /spec/replicas is supported")
        else:
            return status_response(
                415,
                f"the body of the request was in an unknown format: "
                f"accepted media types include: {', '.join(MERGE_TYPES)}, "
                f"{JSON_PATCH}",
            )
        return self._store(dep, patched)

    async def _put_scale(self, request: web.Request) -> web.Response:
        dep = self._find(request)
        if dep is None:
            return not_found(request)
        scale = json.loads(await request.read())
        version = (scale.get("metadata") or {}).get("resourceVersion")
        if version is not None and version != str(dep.resource_version):
            return status_response(
                409,
                f'Operation cannot be fulfilled on deployments.apps "{dep.name}": the object has'
                " been modified; please apply your changes to the latest version and try again",
            )
        return self._store(dep, scale)

    def _store(self, dep: FakeDeployment, scale: Any) -> web.Response:
        replicas = (scale.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            return status_response(
                422, f'Scale.autoscaling "{dep.name}" is invalid: spec.replicas: {replicas!r}'
            )
        if replicas != dep.replicas:
            dep.replicas = replicas
            dep.resource_version += 1
        return web.json_response(scale_object(dep))


# --- Kubernetes objects -------------------------------------------------------------------------


def scale_object(dep: FakeDeployment) -> dict[str, Any]:
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": dep.name,
            "namespace": dep.namespace,
            "resourceVersion": str(dep.resource_version),
        },
        "spec": {"replicas": dep.replicas},
        "status": {"replicas": dep.status_replicas, "selector": f"app={dep.name}"},
    }


def deployment_object(dep: FakeDeployment) -> dict[str, Any]:
    labels = {"app": dep.name}
    return {
        "kind": "Deployment",
        "apiVersion": "apps/v1",
        "metadata": {
            "name": dep.name,
            "namespace": dep.namespace,
            "resourceVersion": str(dep.resource_version),
        },
        "spec": {
            "replicas": dep.replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "worker", "image": "jetfleet:latest"}]},
            },
        },
        "status": {"replicas": dep.status_replicas},
    }


def status_response(code: int, message: str) -> web.Response:
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": REASONS.get(code, "BadRequest"),
        "code": code,
    }
    return web.json_response(status, status=code)


def not_found(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    return status_response(404, f'deployments.apps "{name}" not found')


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def json_patch_replicas(target: dict[str, Any], ops: Any) -> dict[str, Any] | None:
    """RFC 6902 JSON patch, only ``replace``/``add`` of ``/spec/replicas``; None otherwise."""
    if not isinstance(ops, list):
        return None
    out = merge_patch(target, {})
    for op in ops:
        if not isinstance(op, dict) or op.get("path") != "/spec/replicas":
            return None
        if op.get("op") not in ("replace", "add"):
            return None
        out["spec"] = {**out.get("spec", {}), "replicas": op.get("value")}
    return out
