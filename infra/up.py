"""``jetfleet up`` and ``jetfleet servers``: the local fleet on embedded servers."""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
from pathlib import Path

import structlog

from base.process import ProcessGroup, cli_command, wait_http_ok
from infra.cli.components import engine_argv, routing_argv
from infra.embedded import EmbeddedNats, EmbeddedRedis
from schemas import Subjects

log = structlog.get_logger("jetfleet.up")


class _Stop(Exception):
    """SIGINT/SIGTERM arrived: unwind through the ``finally`` blocks that stop everything."""


def _raise_stop(signum: int, _frame: object) -> None:
    raise _Stop(signal.Signals(signum).name)


def _install_stop_handlers() -> None:
    """From the first moment: a signal during start-up must still stop what was started."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _raise_stop)


def _wait_for_signal() -> None:
    with contextlib.suppress(_Stop):
        threading.Event().wait()


def _servers(args: argparse.Namespace) -> tuple[EmbeddedNats, EmbeddedRedis]:
    state = Path(args.state_dir).resolve()
    nats = EmbeddedNats(state / "nats", port=args.nats_port)
    nats.start()
    redis = EmbeddedRedis(state / "redis", port=args.redis_port)
    try:
        redis.start()
    except Exception:
        nats.stop()
        raise
    return nats, redis


def run_servers(args: argparse.Namespace) -> int:
    _install_stop_handlers()
    nats, redis = _servers(args)
    print(f"NATS  {nats.url}\nRedis {redis.url}\n(Ctrl-C stops them)", flush=True)
    try:
        _wait_for_signal()
    finally:
        redis.stop()
        nats.stop()
    return 0


def _start_autoscaling(
    args: argparse.Namespace, group: ProcessGroup, common: list[str], engine: list[str]
) -> None:
    """The local connector starts (and owns) the workers; the planner resizes them. The
    planner's capacity profile defaults to the mocker's at this ``--speedup``."""
    from infra.cli.planner import planner_flags, served_name

    group.start(
        "connector",
        cli_command(
            "connector",
            "local",
            *common,
            *engine,
            "--initial",
            f"agg={args.workers}",
            "--log-dir",
            str(group.log_dir),
        ),
    )
    profile = [] if args.profile else ["--profile", f"mocker:{args.speedup}"]
    group.start(
        "planner",
        cli_command(
            "planner", *common, "--model", served_name(args), *profile, *planner_flags(args)
        ),
    )


def run_up(args: argparse.Namespace, subjects: Subjects) -> int:
    import uvloop

    from infra.tools import infra_init

    _install_stop_handlers()
    nats, redis = _servers(args)
    group = ProcessGroup(Path(args.state_dir).resolve() / "logs")
    common = [
        "--nats",
        nats.url,
        "--subject-prefix",
        subjects.prefix,
        "--log-level",
        args.log_level,
    ]
    try:
        uvloop.run(infra_init(nats.url, subjects, 1, quiet=True))
        engine = engine_argv(args)
        if args.planner:
            _start_autoscaling(args, group, common, engine)
        else:
            for i in range(args.workers):
                group.start(f"worker-{i}", cli_command("worker", *common, *engine))
        if args.router == "kv":
            group.start("indexer", cli_command("indexer", *common, "--redis", redis.url))
        routing = [*routing_argv(args), "--redis", redis.url]
        group.start(
            "frontend",
            cli_command(
                "frontend",
                *common,
                *routing,
                "--host",
                args.host,
                "--port",
                str(args.port),
                "--processes",
                str(args.frontends),
            ),
        )
        wait_http_ok(f"http://{args.host}:{args.port}/ready", 60.0, group)
        scaling = ", autoscaled by the planner" if args.planner else ""
        print(
            f"jetfleet is up: OpenAI API at http://{args.host}:{args.port}/v1 "
            f"({args.workers} {args.engine} workers{scaling}, router {args.router})\n"
            f"NATS {nats.url}  Redis {redis.url}  logs {group.log_dir}\n(Ctrl-C stops the fleet)",
            flush=True,
        )
        _wait_for_signal()
        print("stopping: draining workers and frontend...", flush=True)
    except _Stop:
        print("interrupted during start-up: stopping what was started", flush=True)
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the drain
        # the connector drains the workers it owns before it exits: give it their drain time
        group.stop_all(timeout_s=100.0 if args.planner else 30.0)
        redis.stop()
        nats.stop()
    return 0
