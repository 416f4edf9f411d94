"""The planner's commands of ``jetfleet``:

jetfleet planner [--model M] [--roles agg] [--dry-run] [planner flags, --set k=v]
jetfleet connector local [--initial agg=2] [worker engine flags]
jetfleet connector kubernetes --deployment agg=NAME [--namespace NS] ...
jetfleet replay planner --from 15m [--to now] [--set k=v] [--check] [--json]
jetfleet replay request ID [--from 1h] [--json]
jetfleet replay kv [--at TIME] [--request ID] [--json]
jetfleet replay traffic --from 15m [--to now] [--speed 2] [--target-nats URL]
jetfleet profile --worker-id W [--out profile.json]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.cli.components import ENGINE_START_TIMEOUT_S, add_common, add_engine, engine_argv
from infra.cli.planner_args import role_counts
from schemas import Subjects
from schemas.hashing import DEFAULT_BRANCH_BLOCKS

COMMANDS = ("planner", "connector", "replay", "profile")


def served_name(args: argparse.Namespace) -> str:
    """The served model name a worker started with these engine flags registers under."""
    if getattr(args, "served_model_name", None):
        return str(args.served_model_name)
    if getattr(args, "model", None):
        return Path(args.model).resolve().name
    return "jetfleet-tiny"


def passthrough(args: argparse.Namespace, names: list[str]) -> list[str]:
    out: list[str] = []
    for name in names:
        value: Any = getattr(args, name)
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            if value:
                out.append(flag)
        elif value is not None:
            out += [flag, str(value)]
    return out


PLANNER_SCALARS = [
    "interval",
    "ttft_target",
    "itl_target",
    "mode",
    "predictor",
    "profile",
    "max_total_replicas",
    "scale_up_cooldown",
    "scale_down_cooldown",
]


def planner_flags(args: argparse.Namespace) -> list[str]:
    """The ``jetfleet planner`` flags that reproduce the planner settings in ``args``."""
    out = passthrough(args, PLANNER_SCALARS)
    for item in args.min_replicas:
        out += ["--min-replicas", item]
    for item in args.max_replicas:
        out += ["--max-replicas", item]
    for item in args.settings:
        out += ["--set", item]
    return out


def add_commands(sub: Any) -> None:
    common, engine_args = add_common, add_engine
    from infra.cli.planner_args import add_planner_args

    pl = sub.add_parser("planner", help="plan replicas from the metric stream, publish decisions")
    common(pl)
    pl.add_argument("--model", default="jetfleet-tiny", help="served model name to plan")
    pl.add_argument("--roles", default="agg", help="comma-separated roles to plan")
    pl.add_argument("--dry-run", action="store_true", help="publish decisions marked dry_run")
    pl.add_argument("--metrics-port", type=int, default=0, help="/metrics and /health (0: off)")
    pl.add_argument("--metrics-host", default="127.0.0.1", help="0.0.0.0 in a pod (probes)")
    add_planner_args(pl)

    cn = sub.add_parser("connector", help="act on scaling decisions")
    csub = cn.add_subparsers(dest="connector", required=True)
    loc = csub.add_parser("local", help="start/stop worker processes on this machine")
    common(loc)
    engine_args(loc)
    loc.add_argument(
        "--initial", action="append", default=[], metavar="ROLE=N", help="workers to start with"
    )
    loc.add_argument("--log-dir", default=".jetfleet/logs", help="the workers' log files")
    loc.add_argument(
        "--metrics-port", type=int, default=0, help="/metrics, /health, /ready (0: off)"
    )
    loc.add_argument("--metrics-host", default="127.0.0.1", help="0.0.0.0 in a pod (probes)")
    loc.add_argument(
        "--worker-start-timeout",
        type=float,
        default=None,
        help="seconds a new worker has to register (default: 60 for the mocker, 900 for vLLM: "
        "a real model loads in minutes on a laptop CPU)",
    )
    loc.add_argument(
        "--worker-cores",
        action="append",
        default=[],
        metavar="CPU_LIST",
        help="cores a worker may be given, repeatable: each worker started runs on the one "
        "fewest of its workers run on (--cpu-cores; up gives a CPU engine's slices)",
    )
    loc.add_argument(
        "--worker-nats",
        default=None,
        help="NATS URL the workers it starts connect with (their own user under per-role "
        "permissions; env JETFLEET_WORKER_NATS_URL; default: --nats)",
    )
    from infra.cli.connectors import add_kubernetes_args

    k8s = csub.add_parser("kubernetes", help="set Deployment replicas via the Kubernetes API")
    common(k8s)
    add_kubernetes_args(k8s)
    k8s.add_argument(
        "--metrics-port", type=int, default=0, help="/metrics, /health, /ready (0: off)"
    )
    k8s.add_argument("--metrics-host", default="127.0.0.1", help="0.0.0.0 in a pod (probes)")

    rp = sub.add_parser("replay", help="re-run recorded streams")
    rsub = rp.add_subparsers(dest="replay", required=True)
    rpl = rsub.add_parser("planner", help="re-run the planner over recorded metrics")
    common(rpl)
    rpl.add_argument("--model", default=None, help="served model (default: the fleet's only one)")
    rpl.add_argument(
        "--from", dest="from_", default="1h", help="15m (ago; also s/h/d), epoch or ISO 8601"
    )
    rpl.add_argument("--to", default="now", help="end of the range (now, 5m, epoch, ISO 8601)")
    rpl.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="replay with this planner setting changed (repeatable)",
    )
    rpl.add_argument("--check", action="store_true", help="exit 1 if any decision differs")
    rpl.add_argument("--json", action="store_true", help="machine-readable output")
    rkv = rsub.add_parser("kv", help="the prefix index at a time; why a request went where")
    common(rkv)
    rkv.add_argument("--at", default=None, help="time (default: the request's, else now)")
    rkv.add_argument("--request", default=None, help="explain this request's routing")
    rkv.add_argument("--from", dest="from_", default="1h", help="where to look for the request")
    rkv.add_argument("--json", action="store_true", help="machine-readable output")
    rtr = rsub.add_parser("traffic", help="send recorded requests again, with their timing")
    common(rtr)
    rtr.add_argument("--from", dest="from_", default="15m", help="15m (ago), epoch or ISO 8601")
    rtr.add_argument("--to", default="now", help="end of the range (now, 5m, epoch, ISO 8601)")
    rtr.add_argument("--speed", type=float, default=1.0, help="2 = twice as fast")
    rtr.add_argument("--target-nats", default=None, help="the fleet to send to (default: same)")
    rtr.add_argument(
        "--target-prefix", default=None, help="subject prefix of the target (default: same)"
    )
    rtr.add_argument("--router", default="least-loaded", help="routing policy for the replay")
    rtr.add_argument("--redis", default=None, help="Redis of the target fleet (router kv)")
    rrq = rsub.add_parser("request", help="the life of one request across the streams")
    common(rrq)
    rrq.add_argument("request_id")
    rrq.add_argument("--from", dest="from_", default="1h", help="15m (ago), epoch or ISO 8601")
    rrq.add_argument("--json", action="store_true", help="machine-readable output")

    from infra.profile import add_profile_args

    pf = sub.add_parser("profile", help="measure a worker's capacity profile")
    common(pf)
    add_profile_args(pf)


def run(args: argparse.Namespace, subjects: Subjects, runner: Callable[[Any], Any]) -> int:
    if args.cmd == "planner":
        from infra.cli.planner_args import planner_config
        from planner.service import PlannerServiceConfig, run_planner

        cfg = PlannerServiceConfig(
            nats_url=args.nats,
            subjects=subjects,
            model=args.model,
            roles=tuple(r for r in args.roles.split(",") if r),
            planner=planner_config(args),
            dry_run=args.dry_run,
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
        )
        runner(run_planner(cfg))
        return 0
    if args.cmd == "connector" and args.connector == "local":
        from infra.cli.connectors import local_config, run_local_connector

        worker_nats = args.worker_nats or os.environ.get("JETFLEET_WORKER_NATS_URL") or args.nats
        scaler = local_config(
            worker_nats,
            subjects.prefix,
            args.log_dir,
            [*engine_argv(args), "--metrics-port", "-1"],  # each worker advertises its port
            args.log_level,
            args.worker_start_timeout or ENGINE_START_TIMEOUT_S[args.engine],
            args.worker_cores,
        )
        return int(
            runner(
                run_local_connector(
                    args.nats,
                    subjects,
                    served_name(args),
                    scaler,
                    role_counts(args.initial, "--initial"),
                    args.metrics_port,
                    args.metrics_host,
                )
            )
        )
    if args.cmd == "connector" and args.connector == "kubernetes":
        from infra.cli.connectors import run_kubernetes_connector

        return int(run_kubernetes_connector(args, subjects))
    if args.cmd == "replay" and args.replay == "traffic":
        return int(runner(_replay_traffic(args, subjects)))
    if args.cmd == "replay" and args.replay == "kv":
        return int(runner(_replay_kv(args, subjects)))
    if args.cmd == "replay" and args.replay == "request":
        return int(runner(_replay_request(args, subjects)))
    if args.cmd == "replay":
        return int(runner(_replay(args, subjects)))
    if args.cmd == "profile":
        from infra.profile import run_profile

        return int(run_profile(args, subjects))
    return 2


async def _replay(args: argparse.Namespace, subjects: Subjects) -> int:
    from base.connect import close_nats
    from infra.tools import connect_tool
    from planner.replay import parse_time, print_report, replay_planner

    try:
        from_s, to_s = parse_time(args.from_), parse_time(args.to)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    nc = await connect_tool(args.nats, "replay")
    try:
        model = args.model or await _only_model(nc.jetstream(), subjects)
        if model is None:
            return 2
        report = await replay_planner(nc.jetstream(), subjects, model, from_s, to_s, args.settings)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    finally:
        await close_nats(nc)
    print_report(report, args.json)
    if args.check and (report.differing or not report.rows):
        return 1
    return 0


async def _only_model(js: Any, subjects: Subjects) -> str | None:
    """The fleet's one served model; None (after saying why) when there are none or several."""
    from infra.tools import load_cards

    names = sorted(await load_cards(js, subjects))
    if len(names) == 1:
        return names[0]
    print(
        "choose --model from: " + ", ".join(names) if names else "no model is registered",
        file=sys.stderr,
    )
    return None


async def _replay_request(args: argparse.Namespace, subjects: Subjects) -> int:
    from base.connect import close_nats
    from infra.replay_request import print_timeline, request_timeline
    from infra.tools import connect_tool
    from planner.replay import parse_time

    try:
        from_s = parse_time(args.from_)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    nc = await connect_tool(args.nats, "replay")
    try:
        entries = await request_timeline(nc.jetstream(), subjects, args.request_id, from_s)
    finally:
        await close_nats(nc)
    print_timeline(entries, args.json)
    return 0 if entries else 1


async def _replay_kv(args: argparse.Namespace, subjects: Subjects) -> int:
    from base.connect import close_nats
    from infra.tools import connect_tool, load_cards
    from planner.replay import parse_time
    from router.kv.replay import print_kv, replay_kv

    try:
        from_s = parse_time(args.from_)
        at_s = parse_time(args.at) if args.at else None
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    nc = await connect_tool(args.nats, "replay")
    try:
        js = nc.jetstream()
        cards = await load_cards(js, subjects)
        card = next(iter(cards.values())) if len(cards) == 1 else None
        block_size = card.block_size if card is not None else 16
        branch = card.kv_branch_blocks if card is not None else DEFAULT_BRANCH_BLOCKS
        report = await replay_kv(js, subjects, at_s, args.request, from_s, block_size, branch)
    except LookupError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    finally:
        await close_nats(nc)
    print_kv(report, args.json)
    return 0


async def _replay_traffic(args: argparse.Namespace, subjects: Subjects) -> int:
    from infra.replay_traffic import print_summary, replay_traffic
    from planner.replay import parse_time

    try:
        from_s, to_s = parse_time(args.from_), parse_time(args.to)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if args.speed <= 0:
        print("--speed must be positive", file=sys.stderr)
        return 2
    target = Subjects(args.target_prefix) if args.target_prefix else subjects
    report = await replay_traffic(
        args.nats,
        subjects,
        args.target_nats or args.nats,
        target,
        from_s,
        to_s,
        args.speed,
        args.router,
        args.redis,
    )
    print_summary(report)
    if not report.recorded:
        print("no recorded requests in that time range", file=sys.stderr)
        return 1
    return 0 if all(r.ok for r in report.replayed) else 1
