"""Spans exported with OpenTelemetry: a frontend, a router service and a worker configured the
OpenTelemetry way (``OTEL_EXPORTER_OTLP_ENDPOINT``) send their spans to a real OTLP/HTTP
receiver (the collector's protobuf wire format, decoded with the official ``opentelemetry-proto``
messages), and the spans of one request form one trace: client -> frontend (or router service)
-> worker."""

from __future__ import annotations

import gzip
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import nats
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from infra.command import cli_command
from schemas import Request, SamplingParams, Subjects, TokenChunk, decode, encode
from tests.support.fleet import Fleet
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Exported:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    error: bool


class Collector:
    """An OTLP/HTTP trace receiver: POST /v1/traces, protobuf in, protobuf out."""

    def __init__(self) -> None:
        self.spans: list[Exported] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                ok = self.path == "/v1/traces" and "protobuf" in self.headers["Content-Type"]
                if ok:
                    collector.take(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self, req: ExportTraceServiceRequest) -> None:
        for rs in req.resource_spans:
            attrs = {a.key: a.value for a in rs.resource.attributes}
            service = attrs["service.name"].string_value
            for ss in rs.scope_spans:
                for s in ss.spans:
                    values = {a.key: _value(a.value) for a in s.attributes}
                    self.spans.append(
                        Exported(
                            service,
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            s.kind,
                            values,
                            s.status.code == 2,  # STATUS_CODE_ERROR
                        )
                    )

    def of_trace(self, trace_id: str) -> dict[str, Exported]:
        return {s.service: s for s in self.spans if s.trace_id == trace_id}


def _value(v: Any) -> Any:
    return getattr(v, v.WhichOneof("value"))


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.server.shutdown()


@pytest.fixture(scope="module")
def traced_fleet(nats_server, tmp_path_factory, collector) -> Iterator[Fleet]:
    mp = pytest.MonkeyPatch()
    mp.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)  # the children inherit it
    mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export within 0.1 s, not the default 5 s
    f = Fleet(nats_server.url, tmp_path_factory.mktemp("traced"))
    try:
        f.add_worker()
        f.start_router_service("--router", "round-robin")
        f.start_frontend("--router", "round-robin")
        yield f
    finally:
        f.stop()
        mp.undo()


def _ids() -> tuple[str, str]:
    return uuid.uuid4().hex, uuid.uuid4().hex[:16]


async def test_an_http_request_is_one_trace_from_the_client_to_the_worker(traced_fleet, collector):
    trace_id, client_span = _ids()
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(
            f"{traced_fleet.base_url}/v1/chat/completions",
            json={
                "model": "jetfleet-tiny",
                "messages": [{"role": "user", "content": "trace me"}],
                "max_tokens": 7,
            },
            headers={"traceparent": f"00-{trace_id}-{client_span}-01", "X-Request-Id": "tr-1"},
        )
    assert r.status_code == 200, r.text
    spans = await wait_for(
        lambda: (
            (got := collector.of_trace(trace_id)).keys() >= {"jetfleet-frontend", "jetfleet-worker"}
            and got
        ),
        timeout=20,
    )
    front, worker = spans["jetfleet-frontend"], spans["jetfleet-worker"]
    assert front.parent_span_id == client_span and front.kind == 2  # SERVER
    assert worker.parent_span_id == front.span_id and worker.kind == 5  # CONSUMER
    assert front.name == "POST /v1/chat/completions" and not front.error
    assert front.attributes["http.response.status_code"] == 200
    assert front.attributes["jetfleet.request_id"] == "chatcmpl-tr-1"
    assert front.attributes["jetfleet.worker_id"] == worker.attributes["jetfleet.worker_id"]
    assert worker.attributes["jetfleet.request_id"] == "chatcmpl-tr-1"
    assert worker.attributes["gen_ai.usage.output_tokens"] == 7
    assert worker.attributes["gen_ai.response.finish_reasons"] == "length"


async def test_a_refused_request_is_a_span_too_and_probes_are_not(traced_fleet, collector):
    trace_id, client_span = _ids()
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(
            f"{traced_fleet.base_url}/v1/chat/completions",
            json={"model": "jetfleet-tiny", "messages": []},
            headers={"traceparent": f"00-{trace_id}-{client_span}-01"},
        )
        assert r.status_code == 400
        assert (await http.get(f"{traced_fleet.base_url}/health")).status_code == 200
    spans = await wait_for(lambda: collector.of_trace(trace_id), timeout=20)
    assert spans["jetfleet-frontend"].attributes["http.response.status_code"] == 400
    assert not [s for s in collector.spans if s.name.endswith("/health")]


async def test_a_nats_client_trace_goes_through_the_router_service(traced_fleet, collector):
    trace_id, client_span = _ids()
    subjects = Subjects(traced_fleet.prefix)
    nc = await nats.connect(traced_fleet.nats_url)
    try:
        request = Request(
            request_id=f"traced-{uuid.uuid4().hex}",
            model="jetfleet-tiny",
            token_ids=tuple(b"traced over NATS"),
            sampling=SamplingParams(max_tokens=5, seed=1),
        )
        tokens = await nc.subscribe(subjects.tok(request.request_id))
        await nc.jetstream().publish(
            subjects.submit("jetfleet-tiny"),
            encode(request),
            headers={"traceparent": f"00-{trace_id}-{client_span}-01"},
        )
        chunk = None
        while chunk is None or chunk.finish_reason is None:
            chunk = decode((await tokens.next_msg(timeout=30)).data, TokenChunk)
    finally:
        await nc.close()
    spans = await wait_for(
        lambda: (
            (got := collector.of_trace(trace_id)).keys() >= {"jetfleet-router", "jetfleet-worker"}
            and got
        ),
        timeout=20,
    )
    router, worker = spans["jetfleet-router"], spans["jetfleet-worker"]
    assert router.parent_span_id == client_span
    assert worker.parent_span_id == router.span_id
    assert router.attributes["gen_ai.usage.output_tokens"] == 5


def test_export_configured_without_opentelemetry_is_one_clear_line(tmp_path) -> None:
    """A process configured to export, without the packages, refuses to start (simulated by
    hiding the package: a sitecustomize that makes its import fail)."""
    import os
    import subprocess

    hide = tmp_path / "sitecustomize.py"
    hide.write_text("import sys\nsys.modules['opentelemetry.sdk'] = None\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}
    out = subprocess.run(
        cli_command("frontend", "--nats", "nats://127.0.0.1:1", "--router", "round-robin"),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "pip install 'jetfleet[otel]'" in out.stderr and "Traceback" not in out.stderr
