"""The event generator of an index-scale run, a process of its own (started by
``tests.bench.index_scale``): builds the fleet's batches for a range of chains
(``index_scale_fleet``: the fill, or churn of ``--events`` block events), encoded, before the
clock starts; then publishes them with plain ``nc.publish`` on each worker's ``Subjects.kv``
subject, open loop at ``--rate`` block events/s (0: as fast as it can, for a backlog), and writes
what it did as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import uvloop

from base.connect import close_nats, connect_nats
from base.logs import configure_logging
from schemas import Subjects
from tests.bench.index_scale_env import ready_and_wait_go
from tests.bench.index_scale_fleet import Built, Fleet, FleetSpec, worker_id
from tests.bench.procstat import self_cpu_seconds


def build(fleet: Fleet, args: argparse.Namespace) -> list[Built]:
    skip = frozenset(int(w) for w in args.skip.split(",") if w)
    if args.to_chain:
        return fleet.build(args.to_chain, skip)
    out: list[Built] = []
    events = 0
    spec = fleet.spec
    per_chain = spec.holders * 2 * spec.tail_blocks  # a store and an eviction per holder
    while events < args.events:
        chains = 1 + (args.events - events) // per_chain
        chunk = fleet.build(fleet.next_chain + chains, skip)
        out += chunk
        events += sum(b.block_events for b in chunk)
    return out


async def publish(args: argparse.Namespace, built: list[Built], t0: float) -> dict[str, float]:
    spec = FleetSpec.from_json(args.spec)
    subjects = Subjects(args.prefix)
    subject = [subjects.kv(spec.model, worker_id(w)) for w in range(spec.workers)]
    nc = await connect_nats(args.nats, name="index-scale-gen")
    await asyncio.sleep(max(0.0, t0 - time.monotonic()))
    cpu0 = self_cpu_seconds()
    start = time.monotonic()
    sent = 0
    behind = 0.0
    for i, b in enumerate(built):
        if args.rate:
            due = start + sent / args.rate
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            else:
                behind = max(behind, -wait)
        elif i % 2000 == 1999:
            await nc.flush()
        await nc.publish(subject[b.worker], b.data)
        sent += b.block_events
    await nc.flush()
    end = time.monotonic()
    cpu = self_cpu_seconds() - cpu0
    await close_nats(nc)
    return {"t_start": start, "t_end": end, "cpu_s": round(cpu, 3), "behind_max_s": behind}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nats", required=True)
    ap.add_argument("--prefix", default="fleet")
    ap.add_argument("--spec", required=True, help="FleetSpec as JSON")
    ap.add_argument("--from-chain", type=int, required=True, help="the fleet's position")
    ap.add_argument("--to-chain", type=int, default=0, help="build chains up to this one")
    ap.add_argument("--events", type=int, default=0, help="else: this many block events")
    ap.add_argument("--rate", type=float, default=0.0, help="block events/s (0: all at once)")
    ap.add_argument("--skip", default="", help="worker indices that departed (send nothing)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ready", type=Path, required=True)
    ap.add_argument("--go", type=Path, required=True)
    args = ap.parse_args(argv)
    configure_logging("warning")
    t_build = time.monotonic()
    fleet = Fleet(FleetSpec.from_json(args.spec))
    fleet.advance(args.from_chain)
    built = build(fleet, args)
    build_s = time.monotonic() - t_build
    t0 = ready_and_wait_go(args.ready, args.go)
    run = uvloop.run(publish(args, built, t0))
    out = {
        "batches": len(built),
        "block_events": sum(b.block_events for b in built),
        "to_chain": fleet.next_chain,
        "build_s": round(build_s, 2),
        **run,
    }
    args.out.write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
