"""Spans exported with OpenTelemetry (OTLP over HTTP), when configured the OpenTelemetry way.

Off unless ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (and
``OTEL_SDK_DISABLED`` is not ``true``): the same environment variables every OpenTelemetry SDK
reads, so a collector, its headers (``OTEL_EXPORTER_OTLP_HEADERS``), the sampler
(``OTEL_TRACES_SAMPLER``) and the batch timing (``OTEL_BSP_*``) are set as operators already do.
``jetfleet up --otlp-endpoint URL`` sets the first for every process it starts.

The W3C ``traceparent`` travels without it (``schemas.trace``: the trace id is in every log
line); with it, each process also exports its span of the trace: the frontend one ``SERVER`` span
per HTTP request, whose context it sends on with the routed request; a worker one ``CONSUMER``
span per request attempt, child of that. The exporter runs in the SDK's batch thread, never on
the event loop. ``opentelemetry-sdk`` and its OTLP exporter are the ``otel`` extra: configured
without them, a process refuses to start with one line saying so.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from schemas.trace import HEADER, child_traceparent

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
Attributes = Mapping[str, str | int | float | bool | None]


class TracingUnavailableError(RuntimeError):
    """Export configured, the OpenTelemetry packages missing."""


def export_configured(env: Mapping[str, str] = os.environ) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(env.get(name, "").strip() for name in ENDPOINT_VARS)


def _clean(attributes: Attributes) -> dict[str, str | int | float | bool]:
    return {k: v for k, v in attributes.items() if v is not None}


class Span:
    """One span in flight; ``traceparent`` is what the next hop continues from."""

    __slots__ = ("_span", "trace_id", "traceparent")

    def __init__(self, span: Any, trace_id: str, traceparent: str) -> None:
        self._span = span
        self.trace_id = trace_id
        self.traceparent = traceparent

    def end(self, attributes: Attributes, error: str | None = None) -> None:
        if self._span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        self._span.set_attributes(_clean(attributes))
        if error:
            self._span.set_status(Status(StatusCode.ERROR, error))
        self._span.end()
        self._span = None


class Tracing:
    """The process's span source: exporting, or only continuing the W3C context."""

    def __init__(self, service: str, instance: str, env: Mapping[str, str] = os.environ) -> None:
        self._tracer: Any = None
        self._provider: Any = None
        if not export_configured(env):
            return
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise TracingUnavailableError(
                f"{' or '.join(ENDPOINT_VARS)} is set but OpenTelemetry is not installed "
                f"({exc.name}): pip install 'jetfleet[otel]', or unset it"
            ) from None
        resource = Resource.create(
            {"service.name": env.get("OTEL_SERVICE_NAME", service), "service.instance.id": instance}
        )
        self._provider = TracerProvider(resource=resource)
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self._tracer = self._provider.get_tracer("jetfleet")

    @property
    def exporting(self) -> bool:
        return self._tracer is not None

    def start(
        self,
        name: str,
        parent: str | None,
        kind: str = "server",
        attributes: Attributes | None = None,
    ) -> Span:
        """A span continuing ``parent`` (a ``traceparent``; None or invalid: a new trace)."""
        if self._tracer is None:
            trace_id, traceparent = child_traceparent(parent)
            return Span(None, trace_id, traceparent)
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        propagator = TraceContextTextMapPropagator()
        context = propagator.extract({HEADER: parent}) if parent else None
        span = self._tracer.start_span(
            name,
            context=context,
            kind=getattr(trace.SpanKind, kind.upper()),
            attributes=_clean(attributes or {}),
        )
        carrier: dict[str, str] = {}
        propagator.inject(carrier, context=trace.set_span_in_context(span))
        trace_id = format(span.get_span_context().trace_id, "032x")
        return Span(span, trace_id, carrier[HEADER])

    def shutdown(self) -> None:
        """Export what is still batched (a stopping process)."""
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = self._tracer = None
