"""``jetfleet up`` and ``jetfleet servers``: the local fleet, on embedded servers unless it is
given a NATS (``--nats``, a cluster too) and a Redis (``--redis``, Sentinel too) to run on."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from base.ports import free_port
from base.process import ProcessGroup, Restarter, wait_http_ok
from infra.cli.components import engine_argv, routing_argv
from infra.command import cli_command
from infra.embedded import EmbeddedNats, EmbeddedRedis
from infra.embedded_cluster import CLUSTER_BUS_OFFSET, ClusterNode, EmbeddedRedisCluster
from infra.packing import worker_packs
from schemas import Subjects
from workers.engines.vllm.installed import vllm_cpu_build
from workers.engines.vllm.platform import fleet_cpu_sets, fleet_cpu_threads, fleet_spare_cores

log = structlog.get_logger("jetfleet.up")

VLLM_READY_TIMEOUT_S = 1200.0  # the first vLLM worker to serve (a CPU build loads in 20-60 s)


class _Stop(KeyboardInterrupt):
    """SIGINT/SIGTERM arrived: unwind through the ``finally`` blocks that stop everything. A
    ``KeyboardInterrupt``: an event loop running a start-up step (``uvloop.run``) lets it out,
    where it logged any other exception raised in a callback and went on waiting."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


def _raise_stop(signum: int, _frame: object) -> None:
    raise _Stop(signum)


def _install_stop_handlers() -> None:
    """From the first moment: a signal during start-up must still stop what was started."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _raise_stop)


def _wait_for_signal() -> None:
    with contextlib.suppress(_Stop):
        threading.Event().wait()


def _fleet_servers(args: argparse.Namespace) -> tuple[str, str, list[EmbeddedNats | EmbeddedRedis]]:
    """NATS and Redis URLs for the fleet: the ones given (``up --nats``, ``--redis``: a cluster, a
    Sentinel set, any server already running), else embedded ones started here (stop them). With
    ``--redis-shards N`` above 1 the embedded Redis is a Redis Cluster of N masters: its seed URL
    goes where the single server's would, its nodes are in the servers to stop."""
    state = Path(args.state_dir).resolve()
    started: list[EmbeddedNats | EmbeddedRedis] = []

    def embedded(server: EmbeddedNats | EmbeddedRedis) -> str:
        server.start()
        started.append(server)
        return server.url

    def embedded_cluster(cluster: EmbeddedRedisCluster) -> str:
        cluster.start()  # (stops the nodes it started if it fails)
        started.extend(cluster.nodes)
        return cluster.url

    try:
        nats_url = getattr(args, "nats", None) or embedded(
            EmbeddedNats(state / "nats", port=args.nats_port, sync_interval=args.nats_sync_interval)
        )
        if getattr(args, "redis", None):
            redis_url = str(args.redis)
        elif args.redis_shards > 1:
            redis_url = embedded_cluster(
                EmbeddedRedisCluster(
                    state / "redis-cluster", masters=args.redis_shards, base_port=args.redis_port
                )
            )
        else:
            redis_url = embedded(EmbeddedRedis(state / "redis", port=args.redis_port))
    except BaseException:
        for server in reversed(started):
            server.stop()
        raise
    return nats_url, redis_url, started


def run_servers(args: argparse.Namespace) -> int:
    _install_stop_handlers()
    nats_url, redis_url, servers = _fleet_servers(args)
    nodes = " ".join(s.url for s in servers if isinstance(s, ClusterNode))
    cluster = f" (Redis Cluster seed; every node: {nodes})" if nodes else ""
    print(f"NATS  {nats_url}\nRedis {redis_url}{cluster}\n(Ctrl-C stops them)", flush=True)
    try:
        _wait_for_signal()
    finally:
        for server in reversed(servers):
            server.stop()
    return 0


def _start_connector(
    args: argparse.Namespace,
    group: ProcessGroup,
    common: list[str],
    engine: list[str],
    ops: dict[str, int],
    cpu_sets: list[str] | None = None,
) -> None:
    """The local connector starts (and owns) the workers; the planner (``_start_planner``,
    once the fleet is ready) resizes them. ``cpu_sets``: the cores its workers may be given."""
    initial = [f"{role}={n}" for role, n in _pools(args).items()]
    cores = [flag for c in cpu_sets or [] for flag in ("--worker-cores", c)]
    group.start(
        "connector",
        cli_command(
            "connector",
            "local",
            *common,
            *engine,
            *[flag for item in initial for flag in ("--initial", item)],
            "--log-dir",
            str(group.log_dir),
            "--metrics-port",
            str(ops["connector"]),
            *cores,
        ),
    )


def _start_planner(
    args: argparse.Namespace, group: ProcessGroup, common: list[str], ops: dict[str, int]
) -> None:
    """The planner, once the fleet is ready: started with the workers, it could scale a pool
    allowed to reach zero (``--min-replicas agg=0``) down before the frontend had seen a worker,
    and ``up`` would wait for a ready fleet that never comes. Its capacity profile defaults to the
    mocker's at this ``--speedup``."""
    from infra.cli.planner import planner_flags, served_name

    profile = [] if args.profile else ["--profile", f"mocker:{args.speedup}"]
    group.start(
        "planner",
        cli_command(
            "planner",
            *common,
            "--model",
            served_name(args),
            "--metrics-port",
            str(ops["planner"]),
            "--roles",
            ",".join(_pools(args)),
            *profile,
            *planner_flags(args),
        ),
    )


def _start_workers(
    args: argparse.Namespace,
    group: ProcessGroup,
    common: list[str],
    engine: list[str],
    cpu_sets: list[str] | None = None,
) -> None:
    """A fixed fleet (``--no-planner``): each pool's workers, ``--workers-per-process`` to a
    process (``jetfleet worker --replicas``); the n-th process on ``cpu_sets[n]`` if given."""
    started = 0
    for role, n in _pools(args).items():
        for i, replicas in enumerate(worker_packs(n, args.workers_per_process)):
            packed = ["--replicas", str(replicas)] if replicas > 1 else []
            if cpu_sets:
                packed += ["--cpu-cores", cpu_sets[started % len(cpu_sets)]]
            worker = cli_command(
                "worker", *common, *engine, "--role", role, "--metrics-port", "-1", *packed
            )
            group.start(f"{role}-{i}" if args.disagg else f"worker-{i}", worker)
            started += 1


def _pools(args: argparse.Namespace) -> dict[str, int]:
    """The worker pools ``up`` starts with: role -> workers."""
    if args.disagg:
        return {"prefill": args.prefill_workers, "decode": args.decode_workers}
    return {"agg": args.workers}


def _most_engines(args: argparse.Namespace) -> int:
    """The most engines the planner's fleet runs at once: what its bounds let it scale to (each
    pool's ``--max-replicas``, all within ``--max-total-replicas``), those it starts with at
    least."""
    pools = _pools(args)
    from infra.cli.planner_args import planner_config

    cfg = planner_config(args)
    most = sum(max(n, cfg.max_for(role)) for role, n in pools.items())
    return max(sum(pools.values()), min(most, cfg.max_total_replicas))


def _place_cpu_engines(args: argparse.Namespace, usable: list[int]) -> list[str] | None:
    """A CPU build's threads (``args.cpu_threads``, unless given: the cores shared out among the
    engines it starts with) and the cores of each engine (None: unpinned). A fixed fleet's
    n-th engine takes the n-th slice. With the planner on vLLM's CPU build:

    - unless its bounds are given (``--max-replicas``, ``--max-total-replicas``), it runs at
      most the engines that have cores of their own (or those it starts with, if more): the
      host's cores are its budget, as GPUs are a GPU fleet's. An engine past that slows the
      others down more than it adds (measured: docs/engines/vllm.md);
    - with bounds past that, it is said at the start;
    - its connector gives each engine it starts the slice fewest of its engines run on, so an
      engine started to meet a burst does not share the cores of the one serving it."""
    engines = sum(_pools(args).values())
    if args.cpu_threads is None:
        args.cpu_threads = fleet_cpu_threads(len(usable), engines)
    if args.cpu_cores is not None:
        return None
    if not args.planner:
        return fleet_cpu_sets(usable, engines, args.cpu_threads)
    if not vllm_cpu_build():
        return None  # a GPU build: threads and cores are not its bounds
    spare = fleet_spare_cores(len(usable))
    room = max(1, (len(usable) - spare) // args.cpu_threads)  # engines with cores of their own
    threads = f"{args.cpu_threads} thread{'s' if args.cpu_threads > 1 else ''}"
    if args.max_total_replicas is None and not args.max_replicas:
        args.max_total_replicas = max(room, engines)
        _say(
            f"jetfleet up: the planner runs at most {args.max_total_replicas} vLLM CPU engines "
            f"here ({room} of {threads} fit {len(usable)} cores; --max-replicas ROLE=N or "
            "--max-total-replicas N for more)"
        )
    try:
        most = _most_engines(args)
    except (ValueError, OSError) as exc:  # a bad planner setting: the planner says so itself
        log.warning("planner_bounds_unread", error=str(exc))
        most = engines
    if most > room:
        _say(
            f"jetfleet up: the planner may run {most} vLLM CPU engines of {threads} on "
            f"{len(usable)} cores; engines past {room} share cores and slow each other down "
            "(--max-replicas ROLE=N or --cpu-threads T sizes them)"
        )
    slices = list(dict.fromkeys(fleet_cpu_sets(usable, most, args.cpu_threads) or []))
    return slices if len(slices) > 1 or (slices and spare) else None


def run_up(args: argparse.Namespace, subjects: Subjects) -> int:
    import uvloop

    from infra.tools import infra_init

    _install_stop_handlers()
    if args.otlp_endpoint:  # every process up starts reads it (base.tracing)
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = args.otlp_endpoint
    taken = _ports_taken(args)
    if taken:
        _say(f"jetfleet up: {taken} already in use (another fleet? choose other ports)")
        return 1
    group = ProcessGroup(Path(args.state_dir).resolve() / "logs")
    servers: list[EmbeddedNats | EmbeddedRedis] = []
    try:
        # inside the try: a signal while an embedded server starts is an interrupted start-up
        nats_url, redis_url, servers = _fleet_servers(args)
        common = [
            "--nats",
            nats_url,
            "--subject-prefix",
            subjects.prefix,
            "--log-level",
            args.log_level,
        ]
        try:
            uvloop.run(infra_init(nats_url, subjects, args.replicas, quiet=True))
        except (Exception, SystemExit) as exc:  # a given NATS that does not answer
            _say(f"jetfleet up: cannot set up NATS at {nats_url}: {exc}")
            return 1
        if args.redis:  # a given Redis: the frontends need it from their start
            try:
                uvloop.run(_ping_redis(redis_url))
            except Exception as exc:
                _say(f"jetfleet up: cannot reach Redis at {redis_url}: {exc or type(exc).__name__}")
                return 1
        cpu_sets = None  # (a GPU ignores both)
        if args.engine == "vllm":
            cpu_sets = _place_cpu_engines(args, sorted(os.sched_getaffinity(0)))
        engine = engine_argv(args)
        ops: dict[str, int] = {}  # operations ports: /metrics, /health, /ready
        if args.planner:
            ops["planner"], ops["connector"] = free_port(), free_port()
            _start_connector(args, group, common, engine, ops, cpu_sets)
        else:
            _start_workers(args, group, common, engine, cpu_sets)
        if args.router == "kv":
            ops["indexer"] = free_port()
            indexer = ["--redis", redis_url, "--metrics-port", str(ops["indexer"])]
            group.start("indexer", cli_command("indexer", *common, *indexer))
        routing = [*routing_argv(args), "--redis", redis_url]
        # NATS-only clients (fleet.submit.{model}, ``jetfleet publish``) get the same routing
        ops["router"] = free_port()
        router = ["--metrics-port", str(ops["router"])]
        group.start("router", cli_command("router-service", *common, *routing, *router))
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
        try:
            _wait_ready(args, group)
            if args.planner:
                _start_planner(args, group, common, ops)
                # up says it is up once the planner is too: its start (a Python process importing
                # its stack, ~1 s of CPU) would otherwise compete with the first requests (the
                # first 200 at c=16 measured 230 req/s beside it, 280-300 after)
                wait_http_ok(f"http://127.0.0.1:{ops['planner']}/ready", 60.0, group)
        except (RuntimeError, TimeoutError) as exc:  # a component died, or never got ready
            _say(f"jetfleet up: {_first_line(exc)} (logs in {group.log_dir})")
            return 1
        scaling = ", autoscaled by the planner" if args.planner else ""
        pools = ", ".join(f"{n} {role}" for role, n in _pools(args).items())
        if args.workers_per_process > 1:
            packs = [worker_packs(n, args.workers_per_process) for n in _pools(args).values()]
            pools += f" in {sum(map(len, packs))} processes"
        ops_lines = "  ".join(f"{n} http://127.0.0.1:{p}/metrics" for n, p in sorted(ops.items()))
        _say(
            f"metrics: frontend http://{args.host}:{args.port}/metrics  {ops_lines}  "
            f"workers: jetfleet status --nats {nats_url}\n"
            f"Prometheus: prometheus --config.file=infra/deploy/prometheus/prometheus.yml finds "
            f"every process through http://{args.host}:{args.port}/discovery/prometheus"
            + ("" if args.port == 8000 else " (its two URLs name port 8000: set yours)")
        )
        _say(
            f"jetfleet is up: OpenAI API at http://{args.host}:{args.port}/v1 "
            f"({pools} {args.engine} workers{scaling}, router {args.router})\n"
            f"NATS {nats_url} (clients publish on {subjects.prefix}.submit.MODEL)  "
            f"Redis {redis_url}{_cluster_note(args)}  logs {group.log_dir}\n"
            "(Ctrl-C stops the fleet; a second Ctrl-C stops it at once)"
        )
        with contextlib.suppress(_Stop):
            _supervise(group)
        _say("stopping: draining workers and frontend...")
    except _Stop as stop:
        _say("interrupted during start-up: stopping what was started")
        return stop.exit_code
    finally:
        _stop_everything(group, servers[::-1], drain_s=100.0 if args.planner else 30.0)
    return 0


def serving(ready_body: bytes) -> bool:
    """A frontend's ``/ready`` body says a model has a live worker now. (``/ready`` itself is
    200 for a known model without one, a fleet scaled to zero; a fleet starting waits for
    this.)"""
    try:
        return bool(json.loads(ready_body).get("live_models"))
    except ValueError:
        return False


def _wait_ready(args: argparse.Namespace, group: ProcessGroup) -> None:
    url = f"http://{args.host}:{args.port}/ready"
    if args.engine != "vllm":
        wait_http_ok(url, 60.0, group, until=serving)
        return
    wait_http_ok(  # loading a real model: minutes on a laptop CPU
        url,
        VLLM_READY_TIMEOUT_S,
        group,
        lambda waited: _say(
            f"waiting for the vLLM workers to load {Path(args.model).name} "
            f"({waited:.0f} s; logs in {group.log_dir})"
        ),
        until=serving,
    )


def _cluster_note(args: argparse.Namespace) -> str:
    if args.redis or args.redis_shards == 1:
        return ""
    return f" (seed of the embedded cluster of {args.redis_shards} masters)"


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _ports_taken(args: argparse.Namespace) -> str:
    """The ports up would listen on that something else holds ("" when all are free): the
    frontend's, and the embedded servers' when up starts them on fixed ports."""
    wanted = [(args.host, args.port, "--port")]
    if not getattr(args, "nats", None) and args.nats_port:
        wanted.append(("127.0.0.1", args.nats_port, "--nats-port"))
    if not getattr(args, "redis", None) and args.redis_port:
        wanted += _redis_ports(args.redis_port, args.redis_shards)
    busy = [f"{host}:{port} ({flag})" for host, port, flag in wanted if not _free(host, port)]
    return ", ".join(busy)


def _redis_ports(base: int, shards: int) -> list[tuple[str, int, str]]:
    """The embedded Redis's ports: one, or a cluster's node ports and their bus ports."""
    if shards == 1:
        return [("127.0.0.1", base, "--redis-port")]
    nodes = [
        ("127.0.0.1", base + i, "--redis-port" + (f" + {i}" if i else "")) for i in range(shards)
    ]
    bus = [(h, p + CLUSTER_BUS_OFFSET, f"{flag} + 10000, cluster bus") for h, p, flag in nodes]
    return nodes + bus


def _free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


async def _ping_redis(url: str, timeout_s: float = 10.0) -> None:
    from base.connect import connect_redis

    redis = await connect_redis(url)
    try:
        await asyncio.wait_for(redis.ping(), timeout_s)
    finally:
        await redis.aclose()


def _supervise(group: ProcessGroup, poll_s: float = 0.5) -> None:
    """Until a signal: restart a component that exits (``Restarter``); say so when it loops."""
    restarter = Restarter(group)
    while True:
        time.sleep(poll_s)
        for child, wait in restarter.poll():
            if wait >= 8.0:
                _say(
                    f"{child.name} keeps exiting (see {child.log_path}); restarting in {wait:.0f} s"
                )


def _say(text: str) -> None:
    """Print, even when stdout is a pipe whose reader is gone (``up | tee`` after Ctrl-C)."""
    try:
        print(text, flush=True)
    except OSError:
        _output_to_devnull()


def _output_to_devnull() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def _stop_everything(
    group: ProcessGroup, servers: list[EmbeddedNats | EmbeddedRedis], drain_s: float
) -> None:
    """Drain the processes, then stop the servers; a second Ctrl-C (or SIGTERM) kills them all
    at once. Output may be gone by now (a pipe closed with the terminal): cleanup never stops on
    a failed write."""

    def hard_stop(_signum: int, _frame: object) -> None:
        for child in list(group.children.values()):
            with contextlib.suppress(OSError):
                os.killpg(child.proc.pid, signal.SIGKILL)
        for server in servers:
            if server.proc is not None:
                with contextlib.suppress(OSError):
                    server.proc.kill()
        os._exit(130)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, hard_stop)
    # the connector drains the workers it owns before it exits: give it their drain time
    steps: list[Callable[[], object]] = [lambda: group.stop_all(timeout_s=drain_s)]
    steps += [server.stop for server in servers]
    for step in steps:
        try:
            step()
        except OSError:  # logging to a closed pipe: silence the output and go on
            _output_to_devnull()
            with contextlib.suppress(OSError):
                step()
