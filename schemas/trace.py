"""W3C trace context on the wire: the ``traceparent`` header travels with a request through HTTP
and NATS headers (frontend -> routed request -> worker), so every process logs the same trace id.
Pure."""

from __future__ import annotations

import re
import secrets

HEADER = "traceparent"
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


def parse_traceparent(value: str | None) -> tuple[str, str] | None:
    """(trace id, parent span id) of a valid version-00 ``traceparent``, else None."""
    if value is None:
        return None
    m = _TRACEPARENT.fullmatch(value.strip().lower())
    if m is None or m.group(1) == "0" * 32 or m.group(2) == "0" * 16:
        return None
    return m.group(1), m.group(2)


def child_traceparent(parent: str | None) -> tuple[str, str]:
    """(trace id, traceparent for the next hop): the caller's trace continued with a new span,
    or a new trace when the caller sent none (or an invalid one)."""
    parsed = parse_traceparent(parent)
    trace_id = parsed[0] if parsed else secrets.token_hex(16)
    return trace_id, f"00-{trace_id}-{secrets.token_hex(8)}-01"
