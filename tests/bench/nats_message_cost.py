"""What a token message costs nats-server: CPU per message delivered to a core subscriber, with
and without a memory stream capturing the subjects (as ``FLEET_TOKENS`` captures
``fleet.tok.>``), published back to back (batched by the client) or paced like tokens of
requests generating in real time.

    python -m tests.bench.nats_message_cost                     # back to back and at 6.4 ms
    python -m tests.bench.nats_message_cost --pace-ms 0,10 --requests 320

Each request is one subject (``t.{uuid}``), a subscriber on it, ``--tokens`` messages of
``--bytes`` bytes published on it, ``--concurrency`` requests at a time, each paced by
``--pace-ms`` between its messages (0: back to back). ``--subscriptions shared`` runs the same
with one wildcard subscription for all requests (``t.fe.*``, told apart by subject, as a
frontend could subscribe once for all its requests) instead of a subscription per request, to
price the SUB and UNSUB a request costs. A fresh embedded nats-server per run; its CPU (from
/proc) over the run, and this process's (publisher and subscriber: the clients' side), divided by
the messages. Prints one JSON document: a row per run (each pace without and with the stream,
per subscription mode).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import nats
from nats.aio.msg import Msg
from nats.js.api import StorageType, StreamConfig

from base.logs import configure_logging
from infra.embedded import EmbeddedNats
from tests.bench.procstat import cpu_seconds


def _own_cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


async def one_run(
    stored: bool, pace_s: float, shared: bool, args: argparse.Namespace
) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as d, EmbeddedNats(Path(d)) as server:  # its own port
        pub = await nats.connect(server.url)
        sub_nc = await nats.connect(server.url)
        if stored:
            await pub.jetstream().add_stream(
                StreamConfig(
                    name="TOK",
                    subjects=["t.>"],
                    storage=StorageType.MEMORY,
                    max_age=900,
                    max_bytes=256 << 20,
                )
            )
        payload = b"x" * args.bytes
        lost = 0
        gate = asyncio.Semaphore(args.concurrency)
        waiting: dict[str, Callable[[], None]] = {}  # shared: the request of each subject

        async def demux(msg: Msg) -> None:
            on_message = waiting.get(msg.subject)
            if on_message is not None:
                on_message()

        if shared:
            await sub_nc.subscribe("t.fe.*", cb=demux)
            await sub_nc.flush()
            await sub_nc.flush()

        async def request() -> None:
            nonlocal lost
            subject = f"t.fe.{uuid.uuid4().hex}" if shared else f"t.{uuid.uuid4().hex}"
            got = 0
            done = asyncio.Event()

            def counted() -> None:
                nonlocal got
                got += 1
                if got == args.tokens:
                    done.set()

            async def on(_msg: Msg) -> None:
                counted()

            async with gate:
                sub = None
                if shared:
                    waiting[subject] = counted
                else:
                    sub = await sub_nc.subscribe(subject, cb=on)
                # nats-py 2.16 writes flush()'s PING straight to the socket, ahead of a SUB still
                # in its pending buffer (its flusher task writes that): the first PONG can come
                # back before the server has the subscription, and another connection's first
                # messages miss it (seen under load: whole requests lost). The SUB is written
                # while the first round trip is awaited; the second PING follows it.
                await sub_nc.flush()
                await sub_nc.flush()
                for k in range(args.tokens):
                    await pub.publish(subject, payload)
                    if pace_s:
                        await asyncio.sleep(pace_s)
                    elif k % 4 == 3:
                        await asyncio.sleep(0)
                await pub.flush()
                try:
                    await asyncio.wait_for(done.wait(), 10)
                except TimeoutError:
                    lost += args.tokens - got
                if sub is not None:
                    await sub.unsubscribe()
                waiting.pop(subject, None)

        cpu0, own0, t0 = cpu_seconds(server.pid), _own_cpu_s(), time.monotonic()
        await asyncio.gather(*(request() for _ in range(args.requests)))
        cpu1, own1, t1 = cpu_seconds(server.pid), _own_cpu_s(), time.monotonic()
        await pub.close()
        await sub_nc.close()
    messages = args.requests * args.tokens
    return {
        "subscriptions": "shared" if shared else "per-request",
        "stored": stored,
        "pace_ms": pace_s * 1000,
        "messages": messages,
        "lost": lost,
        "wall_s": round(t1 - t0, 2),
        "server_cpu_s": round(cpu1 - cpu0, 2),
        "server_us_per_message": round(1e6 * (cpu1 - cpu0) / messages, 1),
        "server_us_per_request": round(1e6 * (cpu1 - cpu0) / args.requests, 1),
        "clients_us_per_request": round(1e6 * (own1 - own0) / args.requests, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pace-ms", default="0,6.4", help="comma-separated; 0 = back to back")
    ap.add_argument("--requests", type=int, default=320)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--bytes", type=int, default=200)
    ap.add_argument(
        "--subscriptions", default="per-request", help="comma-separated: per-request, shared"
    )
    args = ap.parse_args(argv)
    configure_logging("warning")
    runs = []
    for mode in args.subscriptions.split(","):
        if mode not in ("per-request", "shared"):
            ap.error(f"--subscriptions: per-request or shared, not {mode!r}")
        for pace in (float(p) / 1000 for p in args.pace_ms.split(",")):
            for stored in (False, True):
                runs.append(asyncio.run(one_run(stored, pace, mode == "shared", args)))
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"benchmark": "nats_message_cost", "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
