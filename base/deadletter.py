"""Move a message a consumer cannot decode or process to the dead-letter subject, and go on.

Every message given up on is counted in ``jetfleet_dead_letters_total{component}`` of the
process's registry (``DeadLetterMetrics``, made once per registry by the component's metrics and
passed in), published or not: either way it is lost to processing.
"""

from __future__ import annotations

import time

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry, Counter

from schemas import DeadLetter, Subjects, encode

log = structlog.get_logger("jetfleet.dlq")


class DeadLetterMetrics:
    """``jetfleet_dead_letters_total{component}``. Without a registry: counted nowhere."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.letters = Counter(
            "jetfleet_dead_letters",
            "Messages a consumer gave up on and moved to {prefix}.dlq.{component}",
            ["component"],
            registry=registry,
        )


UNCOUNTED = DeadLetterMetrics(None)


async def dead_letter(
    nc: NATS,
    subjects: Subjects,
    component: str,
    msg: Msg,
    reason: str,
    metrics: DeadLetterMetrics = UNCOUNTED,
) -> None:
    """Publish ``msg`` (a nats-py Msg) with ``reason`` to {prefix}.dlq.{component}.

    Never raises: a failure to dead-letter is logged, and the consumer carries on.
    """
    metrics.letters.labels(component).inc()
    headers = {k: str(v) for k, v in (getattr(msg, "headers", None) or {}).items()}
    letter = DeadLetter(
        component=component,
        subject=str(getattr(msg, "subject", "")),
        reason=reason[:2000],
        ts_s=time.time(),
        payload=bytes(getattr(msg, "data", b""))[: 1 << 20],
        headers=headers,
    )
    try:
        await nc.publish(subjects.dlq(component), encode(letter))
    except Exception as exc:
        log.error("dead_letter_failed", component=component, reason=reason, error=str(exc))
    else:
        log.warning("dead_lettered", component=component, subject=letter.subject, reason=reason)
