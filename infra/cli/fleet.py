"""The fleet commands: ``jetfleet up | servers | infra init | publish | status``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from infra.cli.components import CLIENT, DISAGG, add_common, add_engine, add_routing
from infra.cli.planner_args import add_planner_args
from infra.packing import AUTO, PACK_FROM, PACK_SIZE, auto_per_process
from schemas import Subjects
from schemas.control import CONTROL_OPS
from schemas.streams import ResponsesRetention

COMMANDS = ("up", "servers", "infra", "publish", "status", "ctl")

# JetStream's fsync policy of the embedded NATS (docs/operating/reliability-multihost.md)
NATS_SYNC_FLAG = ("--nats-sync-interval",)
NATS_SYNC_OPTS: dict[str, Any] = {
    "default": "always",
    "help": "embedded NATS: when JetStream fsyncs. 'always' (default): every write is on disk "
    "before it is acknowledged; a period such as 2m (nats-server's own default) acknowledges at "
    "once and a power cut loses what was not yet written back",
}

# the embedded Redis: one redis-server, or a Redis Cluster of N masters (infra/embedded_cluster.py)
REDIS_SHARDS_FLAG = ("--redis-shards",)
REDIS_SHARDS_OPTS: dict[str, Any] = {
    "type": int,
    "default": 1,
    "metavar": "N",
    "help": "embedded Redis: 1 (default) a single redis-server; N > 1 a Redis Cluster of N "
    "masters on --redis-port and the N-1 ports after it (each also on port + 10000, its cluster "
    "bus), the 16384 slots split evenly; its first node's URL is the seed the fleet is given",
}


def add_commands(sub: Any) -> None:
    up = sub.add_parser(
        "up", help="run the whole local fleet (on embedded servers unless --nats / --redis)"
    )
    add_common(up, nats=False)
    g = up.add_argument_group("fleet")
    g.add_argument("--workers", type=int, default=2, help="workers to start (default: 2)")
    g.add_argument(
        "--workers-per-process",
        type=_per_process,
        default=AUTO,
        metavar="K",
        help="pack the workers K to a process (jetfleet worker --replicas, mocker only): "
        "ceil(N/K) worker processes, for fleets of hundreds of workers on a few cores; needs "
        "--no-planner, since the planner's local connector starts and drains one worker per "
        f"process (default: auto: one a process up to {PACK_FROM - 1} workers or with the "
        f"planner, else packed into max(cores, N/{PACK_SIZE}) processes)",
    )
    g.add_argument("--host", default="127.0.0.1", help="frontend address (default: 127.0.0.1)")
    g.add_argument("--port", type=int, default=8000, help="frontend port (default: 8000)")
    g.add_argument(
        "--frontends",
        type=int,
        default=1,
        help="frontend processes on the port (frontend --processes; default: 1)",
    )
    g.add_argument("--nats-port", type=int, default=14222, help="embedded NATS (default: 14222)")
    g.add_argument("--redis-port", type=int, default=16379, help="embedded Redis (default: 16379)")
    g.add_argument(*NATS_SYNC_FLAG, **NATS_SYNC_OPTS)
    g.add_argument(*REDIS_SHARDS_FLAG, **REDIS_SHARDS_OPTS)
    g.add_argument(
        "--nats",
        default=None,
        help="run on this NATS (a cluster: comma-separated node URLs) instead of an embedded one",
    )
    g.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="stream replicas when up creates them (3 on a NATS cluster; default: 1)",
    )
    g.add_argument("--state-dir", default=".jetfleet", help="server data and process logs")
    g.add_argument(
        "--planner",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="autoscale (default): planner + local connector own the workers, --workers is "
        "the start; --no-planner: a fixed fleet of --workers",
    )
    g.add_argument(
        "--disagg",
        action="store_true",
        help="disaggregated serving: pools of --prefill-workers and --decode-workers instead of "
        "--workers aggregated ones (the planner sizes both)",
    )
    g.add_argument("--prefill-workers", type=int, default=1, help="with --disagg (default: 1)")
    g.add_argument("--decode-workers", type=int, default=1, help="with --disagg (default: 1)")
    g.add_argument(
        "--otlp-endpoint",
        default=None,
        help="export spans of every process to this OTLP/HTTP collector (e.g. "
        "http://127.0.0.1:4318): sets OTEL_EXPORTER_OTLP_ENDPOINT for them",
    )
    add_engine(up)
    # --redis names a Redis to run on (a Sentinel set, one already running); without it up
    # starts an embedded one (JETFLEET_REDIS_URL is not read by up)
    add_routing(
        up,
        redis_default=None,
        redis_help="run on this Redis instead of an embedded one: redis://, rediss://, unix:// "
        "or redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]",
    )
    CLIENT.add_to(up)
    DISAGG.add_to(up)
    add_planner_args(up)

    srv = sub.add_parser("servers", help="run only the embedded NATS and Redis")
    add_common(srv, nats=False)
    srv.add_argument("--nats-port", type=int, default=14222, help="NATS port (0: any free one)")
    srv.add_argument("--redis-port", type=int, default=16379, help="Redis port (0: any free one)")
    srv.add_argument(*NATS_SYNC_FLAG, **NATS_SYNC_OPTS)
    srv.add_argument(*REDIS_SHARDS_FLAG, **REDIS_SHARDS_OPTS)
    srv.add_argument("--state-dir", default=".jetfleet", help="server data and logs")

    infra = sub.add_parser("infra", help="infrastructure")
    isub = infra.add_subparsers(dest="infra_cmd", required=True)
    init = isub.add_parser("init", help="create or update all streams, buckets, object stores")
    add_common(init)
    init.add_argument(
        "--replicas", type=int, default=1, help="stream replicas (3 on a NATS cluster)"
    )
    init.add_argument(
        "--responses-max-age-days",
        type=float,
        default=None,
        help="keep stored responses this long (default: as set, else 30 days)",
    )
    init.add_argument(
        "--responses-max-gib",
        type=float,
        default=None,
        help="keep at most this many GiB of stored responses (and of batches), the oldest "
        "dropped first; reserved on the NATS server (default: as set, else no byte bound)",
    )

    pub = sub.add_parser("publish", help="submit a request over NATS only and stream the answer")
    add_common(pub)
    pub.add_argument("prompt", help="user message (chat template applied) or raw text with --raw")
    pub.add_argument("--model", default=None, help="served model name (default: the only one)")
    pub.add_argument("--max-tokens", type=int, default=64, help="tokens to generate")
    pub.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")
    pub.add_argument("--raw", action="store_true", help="no chat template")
    pub.add_argument("--json", action="store_true", help="print each TokenChunk as JSON")

    st = sub.add_parser("status", help="the live fleet")
    add_common(st)
    st.add_argument("--json", action="store_true", help="machine-readable output")

    ctl = sub.add_parser("ctl", help="a control op on one worker (health, clear_kv, lora_load...)")
    add_common(ctl)
    ctl.add_argument("worker", help="the worker id (jetfleet status lists them)")
    ctl.add_argument("op", choices=CONTROL_OPS, metavar="OP", help=", ".join(CONTROL_OPS))
    ctl.add_argument("args", nargs="*", metavar="KEY=VALUE", help="the op's arguments")
    ctl.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the reply")


def run(args: argparse.Namespace, subjects: Subjects, runner: Callable[[Any], Any]) -> int:
    if args.cmd in ("up", "servers") and (problem := _redis_shards_problem(args)):
        print(f"jetfleet {args.cmd}: {problem}", file=sys.stderr)
        return 2
    if args.cmd == "up":
        from infra.up import run_up

        if args.replicas > 1 and not args.nats:
            print("jetfleet up: --replicas above 1 needs a NATS cluster (--nats)", file=sys.stderr)
            return 2
        if args.workers_per_process == AUTO:
            args.workers_per_process = auto_per_process(
                args.workers, os.cpu_count() or 1, args.planner or args.engine != "mocker"
            )
        problem = _packing_problem(args) or _planner_size_problem(args)
        if problem:
            print(f"jetfleet up: {problem}", file=sys.stderr)
            return 2
        return run_up(args, subjects)
    if args.cmd == "servers":
        from infra.up import run_servers

        return run_servers(args)
    if args.cmd == "infra":
        from infra.tools import infra_init

        return int(runner(infra_init(args.nats, subjects, args.replicas, _retention(args))))
    if args.cmd == "publish":
        from infra.tools import publish

        return int(runner(publish(args, subjects)))
    if args.cmd == "status":
        from infra.tools import status

        return int(runner(status(args.nats, subjects, args.json)))
    if args.cmd == "ctl":
        from infra.tools import control

        pairs = [item.partition("=") for item in args.args]
        if any(not sep for _key, sep, _value in pairs):
            print("jetfleet ctl: arguments are KEY=VALUE", file=sys.stderr)
            return 2
        op_args = {key: value for key, _sep, value in pairs}
        return int(
            runner(control(args.nats, subjects, args.worker, args.op, op_args, args.timeout))
        )
    return 2


def _redis_shards_problem(args: argparse.Namespace) -> str:
    """Why ``--redis-shards`` cannot be done as asked ("" when it can)."""
    if args.redis_shards < 1:
        return f"--redis-shards is 1 or more, not {args.redis_shards}"
    if args.redis_shards > 1 and getattr(args, "redis", None):
        return (
            "--redis-shards starts an embedded Redis Cluster; with --redis there is none to start"
        )
    return ""


def _per_process(text: str) -> int:
    if text == "auto":
        return AUTO
    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number or auto") from None
    if k < 1:
        raise argparse.ArgumentTypeError("at least 1 (or auto)")
    return k


def _planner_size_problem(args: argparse.Namespace) -> str:
    if args.planner and args.workers >= PACK_FROM:
        return (
            f"--workers {args.workers} with the planner: its local connector runs one worker per "
            "process, which a machine does not hold at this size; --no-planner packs them "
            "(--workers-per-process)"
        )
    return ""


def _packing_problem(args: argparse.Namespace) -> str:
    """Why ``--workers-per-process`` cannot be honoured ("" when it can)."""
    k = args.workers_per_process
    if k == 1:
        return ""
    if args.planner:
        return (
            "--workers-per-process above 1 needs --no-planner (the planner's local connector "
            "starts and drains one worker per process)"
        )
    if args.engine != "mocker":
        return "--workers-per-process above 1 packs mocker workers only (--engine mocker)"
    return ""


def _retention(args: argparse.Namespace) -> ResponsesRetention | None:
    """The stored responses' retention ``infra init`` was given (None: keep what is set)."""
    days, gib = args.responses_max_age_days, args.responses_max_gib
    if days is None and gib is None:
        return None
    default = ResponsesRetention()
    return ResponsesRetention(
        timedelta(days=days) if days is not None else default.max_age,
        int(gib * (1 << 30)) if gib is not None else default.max_bytes,
    )
