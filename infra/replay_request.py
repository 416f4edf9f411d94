"""``jetfleet replay request ID``: the whole life of one request across the streams.

Reads from ``--from`` on: the request's submissions and routed attempts (``FLEET_REQUESTS``:
``fleet.submit.*``, ``fleet.req.*``; matched on the ``Nats-Msg-Id`` ``{id}:...``), its token
chunks (``FLEET_TOKENS``: ``fleet.tok.{id}``, kept an hour), its observation with the route
decision (``FLEET_METRICS``: ``fleet.obs.*``) and dead letters that mention it (``FLEET_DLQ``).
An OpenAI ``n > 1`` request shows its ``{id}-{i}`` children too. Entries are ordered by the time
the stream stored them. ``--json`` prints every decoded message in full.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nats.js import JetStreamContext

from base.stream_read import Recorded, read_messages
from schemas import (
    DeadLetter,
    Request,
    RequestObservation,
    Subjects,
    TokenChunk,
    WireDecodeError,
    decode,
    to_builtins,
)
from schemas.requests import prefill_request_id


@dataclass(frozen=True)
class Entry:
    time_s: float
    stream: str
    subject: str
    summary: str
    message: Any


def _matches(request_id: str, candidate: str) -> bool:
    return candidate == request_id or candidate.startswith(f"{request_id}-")


def summarize_request(req: Request, subject: str, subjects: Subjects) -> str:
    if subject.startswith(f"{subjects.prefix}.submit."):
        where = "submitted (unrouted)"
    elif ".w." in subject:
        where = f"routed to worker {subject.rsplit('.', 1)[-1]}"
    else:
        where = f"published to pool {subject.rsplit('.', 1)[-1]}"
    prompt = len(req.token_ids) - req.num_generated_before
    text = (
        f"{req.request_id} attempt {req.attempt} {where}: {prompt} prompt tokens, "
        f"max_tokens {req.sampling.max_tokens}"
    )
    if req.num_generated_before:
        text += f", resuming after {req.num_generated_before} generated tokens"
    if req.route is not None:
        text += f" [{req.route.policy}]"
    return text


def summarize_chunk(chunk: TokenChunk) -> str:
    text = (
        f"{chunk.request_id} attempt {chunk.attempt} chunk {chunk.index} from "
        f"{chunk.worker_id or 'the router'}: {len(chunk.token_ids)} tokens"
    )
    if chunk.finish_reason:
        text += f", finish {chunk.finish_reason}"
    if chunk.error:
        text += f" ({chunk.error})"
    return text


def summarize_observation(obs: RequestObservation) -> str:
    text = (
        f"{obs.request_id} {obs.status} on {obs.worker_id or '-'}: isl {obs.isl_tokens}, "
        f"osl {obs.osl_tokens}, cached {obs.cached_tokens}"
        + (f" ({obs.host_cached_tokens} from host memory)" if obs.host_cached_tokens else "")
        + f", ttft {obs.ttft_s * 1000:.1f} ms, "
        f"itl {obs.itl_s * 1000:.2f} ms, attempts {obs.attempts}"
    )
    if obs.route is not None:
        cands = ", ".join(
            f"{c.worker_id} overlap {c.overlap_blocks} load {c.load:g} cost {c.cost:g}"
            for c in obs.route.candidates
        )
        text += f"; {obs.route.policy} chose {obs.route.worker_id}"
        if cands:
            text += f" among [{cands}]"
    if obs.disagg == "remote":
        text += (
            f"; prefilled remotely ({obs.disagg_reason}) on {obs.prefill_worker_id} in "
            f"{obs.prefill_s * 1000:.1f} ms, KV pulled in {obs.kv_transfer_ms:.2f} ms "
            f"(replay {prefill_request_id(obs.request_id)} for its side)"
        )
    elif obs.disagg:
        text += f"; prefilled locally ({obs.disagg_reason})"
    if obs.error:
        text += f"; error: {obs.error}"
    return text


def timeline_entries(
    request_id: str,
    subjects: Subjects,
    requests: list[Recorded],
    tokens: list[Recorded],
    observations: list[Recorded],
    dead: list[Recorded],
) -> list[Entry]:
    """Pure: the entries about ``request_id`` among the recorded messages, in time order."""
    out: list[Entry] = []
    for r in requests:
        msg_id = r.headers.get("Nats-Msg-Id", "")
        if not _matches(request_id, msg_id.rsplit(":", 1)[0]):
            continue
        try:
            req = decode(r.data, Request)
        except WireDecodeError as exc:
            out.append(Entry(r.time_s, "REQUESTS", r.subject, f"undecodable: {exc}", None))
            continue
        out.append(
            Entry(r.time_s, "REQUESTS", r.subject, summarize_request(req, r.subject, subjects), req)
        )
    for r in tokens:
        try:
            chunk = decode(r.data, TokenChunk)
        except WireDecodeError:
            continue
        out.append(Entry(r.time_s, "TOKENS", r.subject, summarize_chunk(chunk), chunk))
    for r in observations:
        try:
            obs = decode(r.data, RequestObservation)
        except WireDecodeError:
            continue
        if _matches(request_id, obs.request_id):
            out.append(Entry(r.time_s, "METRICS", r.subject, summarize_observation(obs), obs))
    needle = request_id.encode()
    for r in dead:
        try:
            letter = decode(r.data, DeadLetter)
        except WireDecodeError:
            continue
        if needle in letter.payload:
            text = f"dead-lettered by {letter.component} from {letter.subject}: {letter.reason}"
            out.append(Entry(r.time_s, "DLQ", r.subject, text, letter))
    return sorted(out, key=lambda e: e.time_s)


async def request_timeline(
    js: JetStreamContext, subjects: Subjects, request_id: str, from_s: float
) -> list[Entry]:
    start = datetime.fromtimestamp(from_s, UTC)
    p = subjects.prefix
    requests = await read_messages(
        js, subjects.stream_name("REQUESTS"), (f"{p}.req.>", f"{p}.submit.>"), start_time=start
    )
    ids = {request_id}
    for r in requests:
        msg_id = r.headers.get("Nats-Msg-Id", "").rsplit(":", 1)[0]
        if _matches(request_id, msg_id):
            ids.add(msg_id)
    tokens = await read_messages(
        js,
        subjects.stream_name("TOKENS"),
        [subjects.tok(i) for i in sorted(ids)],
        start_time=start,
    )
    observations = await read_messages(
        js, subjects.stream_name("METRICS"), (subjects.obs_all(),), start_time=start
    )
    dead = await read_messages(
        js, subjects.stream_name("DLQ"), (subjects.dlq_all(),), start_time=start
    )
    return timeline_entries(request_id, subjects, requests, tokens, observations, dead)


def print_timeline(entries: list[Entry], as_json: bool) -> None:
    if as_json:
        rows = [
            {
                "time_s": e.time_s,
                "stream": e.stream,
                "subject": e.subject,
                "summary": e.summary,
                "message": to_builtins(e.message) if e.message is not None else None,
            }
            for e in entries
        ]
        print(json.dumps(rows, indent=2, default=str))
        return
    if not entries:
        print("nothing recorded about that request in the time range")
        return
    t0 = entries[0].time_s
    for e in entries:
        stamp = datetime.fromtimestamp(e.time_s, UTC).strftime("%H:%M:%S.%f")[:-3]
        print(f"{stamp} +{(e.time_s - t0) * 1000:8.1f} ms  {e.stream:<8} {e.summary}")
