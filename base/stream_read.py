"""Read recorded messages back from a stream: a sequence or time range of some subjects, or the
last message of each subject. Used by planner recovery and the replay tools (never by the live
hot path)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError


@dataclass(frozen=True)
class Recorded:
    seq: int
    subject: str
    data: bytes
    time_s: float  # when the stream stored it (server clock)
    headers: dict[str, str]


async def read_range(
    js: JetStreamContext,
    stream: str,
    subjects: Sequence[str],
    start_seq: int = 1,
    last_seq: int | None = None,
    start_time: datetime | None = None,
    batch: int = 1000,
    idle_timeout_s: float = 1.0,
) -> list[tuple[int, str, bytes]]:
    """``(seq, subject, data)`` of the messages on ``subjects`` in ``stream`` from ``start_seq``
    (or from ``start_time``, an aware datetime) up to ``last_seq`` (None: to the end), in order."""
    got = await read_messages(
        js, stream, subjects, start_seq, last_seq, start_time, batch, idle_timeout_s
    )
    return [(r.seq, r.subject, r.data) for r in got]


async def read_messages(
    js: JetStreamContext,
    stream: str,
    subjects: Sequence[str],
    start_seq: int = 1,
    last_seq: int | None = None,
    start_time: datetime | None = None,
    batch: int = 1000,
    idle_timeout_s: float = 1.0,
) -> list[Recorded]:
    """Like ``read_range``, with each message's stream timestamp and headers."""
    if last_seq is not None and last_seq < start_seq:
        return []
    cfg = api.ConsumerConfig(
        filter_subjects=list(subjects),
        ack_policy=api.AckPolicy.NONE,
        inactive_threshold=30.0,
    )
    if start_time is not None:
        cfg.deliver_policy = api.DeliverPolicy.BY_START_TIME
        cfg.opt_start_time = start_time
    else:
        cfg.deliver_policy = api.DeliverPolicy.BY_START_SEQUENCE
        cfg.opt_start_seq = max(start_seq, 1)
    try:
        psub = await js.pull_subscribe("", stream=stream, config=cfg)
    except NotFoundError:
        return []
    out: list[Recorded] = []
    try:
        while True:
            try:
                msgs = await psub.fetch(batch=batch, timeout=idle_timeout_s)
            except (NatsTimeoutError, TimeoutError):
                return out
            for m in msgs:
                seq = m.metadata.sequence.stream
                if last_seq is not None and seq > last_seq:
                    return out
                stamp = m.metadata.timestamp
                out.append(
                    Recorded(
                        seq,
                        m.subject,
                        m.data,
                        stamp.timestamp() if stamp is not None else 0.0,
                        {k: str(v) for k, v in (m.headers or {}).items()},
                    )
                )
                if m.metadata.num_pending == 0:
                    return out
    finally:
        with contextlib.suppress(Exception):
            await psub.unsubscribe()


async def last_per_subject(
    js: JetStreamContext, stream: str, subject: str
) -> list[tuple[int, str, bytes]]:
    """The newest message of every subject matching ``subject`` (a wildcard), in seq order."""
    try:
        info = await js.stream_info(stream, subjects_filter=subject)
    except NotFoundError:
        return []
    subjects = sorted((info.state.subjects or {}).keys())
    out: list[tuple[int, str, bytes]] = []
    for name in subjects:
        with contextlib.suppress(NotFoundError):
            raw = await js.get_last_msg(stream, name)
            out.append((raw.seq or 0, name, raw.data or b""))
    return sorted(out)
