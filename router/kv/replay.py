"""``jetfleet replay kv --at TIME [--request ID]``: the prefix index as it was, and why a request
went where it went.

Rebuilds the index from ``FLEET_KV`` alone (every batch stored up to ``--at``, in stream order,
through the same translation into ops and the in-memory implementation of the index contract), so
it needs neither Redis nor the live indexer. With ``--request`` (and ``--at`` defaulting to the
moment its first attempt was routed) it recomputes the prompt's block hashes, matches them
against the rebuilt index and prints every worker's overlap next to what the router recorded
(its candidates' overlaps, loads and costs). A difference means the live index lagged or was
ahead at decision time, or the router's recent-route hints counted blocks not yet indexed.

Not reconstructed: workers that left discovery before ``--at`` (the live indexer drops them on
departure; replay only knows their events), and Redis-side reservations.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from nats.js import JetStreamContext

from base.stream_read import Recorded, read_messages
from router.kv.index import InMemoryPrefixIndex
from router.kv.translate import fleet_hashes_for_prompt, legacy, ops_of
from schemas import KvEventBatch, Request, RouteDecision, Subjects, WireDecodeError, decode
from schemas.hashing import DEFAULT_BRANCH_BLOCKS


@dataclass
class KvReplay:
    at_s: float
    batches: int = 0
    undecodable: int = 0
    workers: dict[str, dict[str, int]] = field(default_factory=dict)  # model -> worker -> blocks
    request: Request | None = None
    routed_to: str = ""
    overlaps: dict[str, int] = field(default_factory=dict)
    recorded: RouteDecision | None = None
    prompt_blocks: int = 0


async def rebuild(batches: list[Recorded], at_s: float) -> tuple[InMemoryPrefixIndex, KvReplay]:
    """Apply every batch stored at or before ``at_s`` to a fresh in-memory index."""
    index = InMemoryPrefixIndex()
    report = KvReplay(at_s)
    for rec in batches:
        if rec.time_s > at_s:
            break
        try:
            batch = decode(rec.data, KvEventBatch)
        except WireDecodeError:
            report.undecodable += 1
            continue
        if legacy(batch):  # engine hashes of an older release: not placeable
            report.undecodable += 1
            continue
        ops = ops_of(batch)
        await index.apply(batch.model, batch.worker_id, batch.event_id, rec.seq, ops)
        report.batches += 1
    for model, blocks in index.dump().items():
        per_worker: dict[str, int] = {}
        for holders in blocks.values():
            for worker in holders:
                per_worker[worker] = per_worker.get(worker, 0) + 1
        report.workers[model] = dict(sorted(per_worker.items()))
    return index, report


def first_attempt(requests: list[Recorded], request_id: str) -> tuple[Request, Recorded] | None:
    for rec in requests:
        if rec.headers.get("Nats-Msg-Id") != f"{request_id}:0":
            continue
        try:
            return decode(rec.data, Request), rec
        except WireDecodeError:
            return None
    return None


async def replay_kv(
    js: JetStreamContext,
    subjects: Subjects,
    at_s: float | None,
    request_id: str | None,
    from_s: float,
    block_size: int,
    branch_blocks: int = DEFAULT_BRANCH_BLOCKS,
) -> KvReplay:
    start = datetime.fromtimestamp(from_s, UTC)
    request: tuple[Request, Recorded] | None = None
    if request_id is not None:
        p = subjects.prefix
        requests = await read_messages(
            js, subjects.stream_name("REQUESTS"), (f"{p}.req.>",), start_time=start
        )
        request = first_attempt(requests, request_id)
        if request is None:
            raise LookupError(f"no routed request {request_id!r} since {start.isoformat()}")
    if at_s is not None:
        when = at_s
    elif request is not None:
        when = request[1].time_s
    else:
        when = datetime.now(UTC).timestamp()
    batches = await read_messages(js, subjects.stream_name("KV"), (subjects.kv_all(),))
    index, report = await rebuild(batches, when)
    if request is not None:
        req, rec = request
        hashes = fleet_hashes_for_prompt(req.token_ids, block_size, req.lora_name, branch_blocks)
        report.request = req
        report.routed_to = rec.subject.rsplit(".", 1)[-1] if ".w." in rec.subject else ""
        report.prompt_blocks = len(hashes)
        report.overlaps = await index.match(req.model, hashes)
        report.recorded = req.route
    return report


def print_kv(report: KvReplay, as_json: bool) -> None:
    recorded = {c.worker_id: c for c in (report.recorded.candidates if report.recorded else ())}
    if as_json:
        out: dict[str, Any] = {
            "at_s": report.at_s,
            "batches": report.batches,
            "undecodable": report.undecodable,
            "workers": report.workers,
        }
        if report.request is not None:
            out["request"] = {
                "request_id": report.request.request_id,
                "routed_to": report.routed_to,
                "prompt_blocks": report.prompt_blocks,
                "replayed_overlap": report.overlaps,
                "recorded": {
                    w: {"overlap": c.overlap_blocks, "load": c.load, "cost": c.cost}
                    for w, c in recorded.items()
                },
            }
        print(json.dumps(out, indent=2))
        return
    stamp = datetime.fromtimestamp(report.at_s, UTC).isoformat(timespec="milliseconds")
    print(f"index at {stamp}: {report.batches} batches applied ({report.undecodable} undecodable)")
    for model, workers in report.workers.items():
        for worker, blocks in workers.items():
            print(f"  {model:<16} {worker:<24} {blocks:>7} blocks")
    if report.request is None:
        return
    req = report.request
    print(
        f"request {req.request_id}: {report.prompt_blocks} full prompt blocks, routed to "
        f"{report.routed_to or '(a pool)'}"
        + (f" by {report.recorded.policy}" if report.recorded else "")
    )
    names = sorted(set(report.overlaps) | set(recorded) | {report.routed_to} - {""})
    for worker in names:
        mark = "*" if worker == report.routed_to else " "
        line = f" {mark} {worker:<24} overlap now {report.overlaps.get(worker, 0):>5}"
        if worker in recorded:
            c = recorded[worker]
            line += f"   recorded overlap {c.overlap_blocks:>5} load {c.load:g} cost {c.cost:g}"
        print(line)
