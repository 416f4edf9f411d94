"""The service commands: ``jetfleet frontend | worker | router-service | indexer``.

Each builds its component's config from the flags declared in ``components.py`` and runs it until
SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.cli.components import (
    CLIENT,
    DEFAULT_REDIS,
    DISAGG,
    FRONTEND,
    FRONTEND_SERVICE,
    INDEXER,
    MOCKER,
    REDIS_HELP,
    TOKENIZE,
    VLLM,
    WORKER,
    add_common,
    add_engine,
    add_routing,
    common_argv,
    routing_argv,
    routing_stack,
)
from schemas import Subjects

COMMANDS = ("frontend", "worker", "router-service", "indexer")
Runner = Callable[[Any], Any]


def add_commands(sub: Any) -> None:
    fe = sub.add_parser("frontend", help="OpenAI-compatible HTTP frontend")
    add_common(fe)
    FRONTEND_SERVICE.add_to(fe)
    fe.add_argument(
        "--processes",
        type=int,
        default=1,
        help="frontend processes sharing the port (SO_REUSEPORT), each stateless; a supervisor "
        "restarts any that dies and /metrics sums them all (default: 1)",
    )
    add_routing(fe)
    CLIENT.add_to(fe)
    DISAGG.add_to(fe)
    FRONTEND.add_to(fe)
    TOKENIZE.add_to(fe)

    wk = sub.add_parser("worker", help="a worker process (mocker or vllm engine)")
    add_common(wk)
    add_engine(wk)
    WORKER.add_to(wk)
    wk.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="mocker workers in this process, for scale runs: each a whole worker on the wire "
        "(ids WORKER_ID-0..N-1), sharing the connection, tokenizer, metrics port and cancel "
        "subscription; started 32 at a time, all drained on SIGTERM (default: 1)",
    )

    ix = sub.add_parser("indexer", help="KV indexer: FLEET_KV -> Redis prefix index")
    add_common(ix)
    ix.add_argument(
        "--redis",
        default=DEFAULT_REDIS,
        help=REDIS_HELP,
    )
    INDEXER.add_to(ix)

    rs = sub.add_parser("router-service", help="route requests NATS clients submit")
    add_common(rs)
    add_routing(rs)
    CLIENT.add_to(rs)
    DISAGG.add_to(rs)
    rs.add_argument(
        "--metrics-port", type=int, default=0, help="/metrics, /health, /ready (0: off)"
    )
    rs.add_argument("--metrics-host", default="127.0.0.1", help="0.0.0.0 in a pod (probes)")


def run(args: argparse.Namespace, subjects: Subjects, runner: Runner) -> int:
    if args.cmd == "frontend":
        return _frontend(args, subjects, runner)
    if args.cmd == "worker":
        return _worker(args, subjects, runner)
    if args.cmd == "router-service":
        from router.service import RouterServiceConfig, run_router_service

        cfg = RouterServiceConfig(
            routing_stack(args, subjects),
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
        )
        return _serve(runner, run_router_service(cfg), "router-service", args)
    if args.cmd == "indexer":
        from router.indexer import run_indexer

        runner(
            run_indexer(
                INDEXER.build(args, nats_url=args.nats, redis_url=args.redis, subjects=subjects)
            )
        )
        return 0
    return 2


def _frontend(args: argparse.Namespace, subjects: Subjects, runner: Runner) -> int:
    from router.frontend.service import run_frontend

    if args.processes > 1:
        from infra.frontends import run_frontend_processes

        return run_frontend_processes(args.processes, frontend_argv(args), args.port)
    env_keys = tuple(k for k in os.environ.get("JETFLEET_API_KEYS", "").split(",") if k)
    http = FRONTEND.build(
        args, api_keys=tuple(args.api_key) + env_keys, tokenize=TOKENIZE.build(args)
    )
    cfg = FRONTEND_SERVICE.build(args, stack=routing_stack(args, subjects), http=http)
    return _serve(runner, run_frontend(cfg), "frontend", args)


def _serve(runner: Runner, coro: Any, command: str, args: argparse.Namespace) -> int:
    """Run a routing service; an unreachable Redis or a taken port is one clear line, not a
    traceback."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    try:
        runner(coro)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        where = f"{getattr(args, 'host', '')}:{getattr(args, 'port', '')}"
        print(
            f"jetfleet {command}: cannot listen on {where}: it is in use (--port)", file=sys.stderr
        )
        return 1
    except RedisConnectionError as exc:
        print(
            f"jetfleet {command}: cannot reach Redis at {args.redis} ({exc}); the kv router "
            "keeps its index there (--redis URL, or a router without Redis: --router "
            "least-loaded)",
            file=sys.stderr,
        )
        return 2
    return 0


def frontend_argv(args: argparse.Namespace) -> list[str]:
    """The flags of one frontend process like the ones ``args`` describe (``--processes 1``)."""
    return [
        *common_argv(args),
        *FRONTEND_SERVICE.argv(args),
        "--redis",
        str(args.redis),
        *routing_argv(args),
        *FRONTEND.argv(args),
        *TOKENIZE.argv(args),
    ]


def _vllm_extra(items: list[str]) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"--vllm-arg expects KEY=VALUE, got {item!r}")
        try:
            extra[key] = json.loads(raw)
        except json.JSONDecodeError:
            extra[key] = raw
    return extra


def _worker(args: argparse.Namespace, subjects: Subjects, runner: Runner) -> int:
    from model.card import default_model_dir, load_model_dir
    from workers.engines.vllm.backend import VllmNotInstalledError
    from workers.main import EngineChoice, EngineFailedError, run_worker

    model_dir = Path(args.model) if args.model else default_model_dir()
    local = load_model_dir(
        model_dir,
        args.served_model_name,
        args.block_size,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
    )
    cfg = WORKER.build(
        args,
        nats_url=args.nats,
        model_dir=model_dir,
        model_name=local.name,
        engine=args.engine,
        subjects=subjects,
        block_size=args.block_size,
    )
    mocker = MOCKER.build(args)
    vllm = None
    if args.engine == "vllm":
        vllm = VLLM.build(
            args,
            model=args.vllm_model or str(model_dir),
            extra_engine_args=_vllm_extra(args.vllm_arg),
        )
    if args.replicas < 1 or (args.replicas > 1 and args.engine != "mocker"):
        print("jetfleet worker: --replicas is 1, or more with --engine mocker", file=sys.stderr)
        return 2
    try:
        runner(run_worker(cfg, EngineChoice(args.engine, mocker, vllm), local, args.replicas))
    except VllmNotInstalledError as exc:
        print(f"jetfleet worker: {exc}", file=sys.stderr)
        return 2
    except EngineFailedError as exc:  # left the fleet; a supervisor starts a new one
        print(
            f"jetfleet worker: the engine died ({exc}); the worker left the fleet", file=sys.stderr
        )
        return 1
    return 0
