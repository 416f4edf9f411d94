"""``jetfleet replay traffic --from T1 --to T2 [--speed X] [--target-nats URL]``: send recorded
requests again, with their recorded timing, to a fleet (the same or a new one).

The recorded requests are the first attempts in ``FLEET_REQUESTS`` (message id ``{id}:0``;
unrouted submissions ``{id}:submit`` too), already tokenized, with their sampling parameters.
Each is sent again as ``{id}-replay-{k}`` at ``(t - t_first) / speed`` after the start, routed
in this process with the chosen policy (the routing library the frontend uses), and followed to
its last token. The summary compares the replay with the recording: requests, errors, TTFT and
end-to-end percentiles, and what the recorded observations said about the same requests.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec

from base.connect import close_nats, connect_nats, connect_redis
from base.stream_read import Recorded, read_messages
from base.topology import ensure_topology
from planner.observe import percentile
from router.client import ClientConfig, FleetClient
from router.discovery import Discovery
from router.fleet_state import FleetState
from router.generation import NoWorkersError, OverloadedError
from router.kv.router import KvRouterConfig
from router.routers import build_router
from schemas import Request, RequestObservation, Subjects, WireDecodeError, decode


@dataclass(frozen=True)
class Recording:
    at_s: float  # stream time of the original
    request: Request


@dataclass
class Replayed:
    request_id: str
    ok: bool
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    tokens: int = 0
    error: str = ""


@dataclass
class TrafficReport:
    recorded: int = 0
    replayed: list[Replayed] = field(default_factory=list)
    recorded_ttft_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0


def recorded_requests(messages: list[Recorded], from_s: float, to_s: float) -> list[Recording]:
    """Pure: first attempts (and unrouted submissions) stored in ``[from_s, to_s]``."""
    out: list[Recording] = []
    seen: set[str] = set()
    for rec in messages:
        if not from_s <= rec.time_s <= to_s:
            continue
        msg_id = rec.headers.get("Nats-Msg-Id", "")
        rid, _, kind = msg_id.rpartition(":")
        if kind not in ("0", "submit") or rid in seen:
            continue
        try:
            req = decode(rec.data, Request)
        except WireDecodeError:
            continue
        seen.add(rid)
        out.append(Recording(rec.time_s, req))
    return out


async def _follow(client: FleetClient, req: Request) -> Replayed:
    start = time.monotonic()
    try:
        gen = await client.generate(req)
    except (NoWorkersError, OverloadedError) as exc:
        return Replayed(req.request_id, False, error=str(exc))
    out = Replayed(req.request_id, True)
    async for chunk in gen:
        if chunk.token_ids and not out.ttft_s:
            out.ttft_s = time.monotonic() - start
        out.tokens += len(chunk.token_ids)
        if chunk.finish_reason is not None:
            out.ok = chunk.finish_reason != "error"
            out.error = chunk.error or ""
    out.e2e_s = time.monotonic() - start
    return out


async def replay_traffic(
    source_nats: str,
    source: Subjects,
    target_nats: str,
    target: Subjects,
    from_s: float,
    to_s: float,
    speed: float,
    router: str,
    redis_url: str | None,
) -> TrafficReport:
    report = TrafficReport()
    start_dt = datetime.fromtimestamp(from_s, UTC)
    src = await connect_nats(source_nats, name="replay-traffic-source")
    try:
        js = src.jetstream()
        p = source.prefix
        messages = await read_messages(
            js, source.stream_name("REQUESTS"), (f"{p}.req.>", f"{p}.submit.>"), start_time=start_dt
        )
        recordings = recorded_requests(messages, from_s, to_s)
        ids = {r.request.request_id for r in recordings}
        obs = await read_messages(
            js, source.stream_name("METRICS"), (source.obs_all(),), start_time=start_dt
        )
    finally:
        await close_nats(src)
    report.recorded = len(recordings)
    for stored in obs:
        try:
            o = decode(stored.data, RequestObservation)
        except WireDecodeError:
            continue
        if o.request_id in ids and o.ttft_s > 0:
            report.recorded_ttft_s.append(o.ttft_s)
    if not recordings:
        return report
    nc = await connect_nats(target_nats, name="replay-traffic")
    await ensure_topology(nc.jetstream(), target)
    redis = await connect_redis(redis_url) if redis_url and router == "kv" else None
    state = FleetState()
    client = FleetClient(
        nc,
        target,
        state,
        build_router(router, target, redis, KvRouterConfig()),
        ClientConfig(wait_for_worker_s=5.0),
    )
    discovery = Discovery(nc, target, state)
    await discovery.start()
    client.start()
    try:
        t0 = recordings[0].at_s
        began = time.monotonic()
        tasks: list[asyncio.Task[Replayed]] = []
        for k, rec in enumerate(recordings):
            due = began + (rec.at_s - t0) / speed
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            again = msgspec.structs.replace(
                rec.request,
                request_id=f"{rec.request.request_id}-replay-{k}",
                created_at_s=time.time(),
                route=None,
            )
            tasks.append(asyncio.create_task(_follow(client, again)))
        report.replayed = list(await asyncio.gather(*tasks))
        report.wall_s = time.monotonic() - began
    finally:
        await client.stop()
        await discovery.stop()
        if redis is not None:
            await redis.aclose()
        await close_nats(nc)
    return report


def summary(report: TrafficReport) -> dict[str, Any]:
    ok = [r for r in report.replayed if r.ok]
    ttft = [r.ttft_s * 1000 for r in ok if r.ttft_s]
    e2e = [r.e2e_s * 1000 for r in ok]
    rec = [t * 1000 for t in report.recorded_ttft_s]
    return {
        "recorded_requests": report.recorded,
        "replayed": len(report.replayed),
        "errors": len(report.replayed) - len(ok),
        "wall_s": round(report.wall_s, 2),
        "ttft_ms": {"p50": round(percentile(ttft, 50), 1), "p99": round(percentile(ttft, 99), 1)},
        "e2e_ms": {"p50": round(percentile(e2e, 50), 1), "p99": round(percentile(e2e, 99), 1)},
        "recorded_ttft_ms": {
            "p50": round(percentile(rec, 50), 1),
            "p99": round(percentile(rec, 99), 1),
        },
        "error_samples": sorted({r.error for r in report.replayed if not r.ok})[:5],
    }


def print_summary(report: TrafficReport) -> None:
    print(json.dumps(summary(report), indent=2))
