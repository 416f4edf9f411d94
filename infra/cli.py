"""``jetfleet``: one command for every component and tool.

jetfleet up                      whole local fleet on embedded NATS + Redis (Ctrl-C stops it)
jetfleet servers                 only the embedded NATS + Redis
jetfleet infra init              create/update streams, buckets, object stores
jetfleet frontend | worker | router-service
jetfleet publish "prompt"        a NATS-only client: submit, stream the answer
jetfleet status [--json]         live workers, roles, load, KV usage, heartbeat age
jetfleet planner | connector | replay planner | profile   scaling (infra/cli_planner.py)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

DEFAULT_NATS = os.environ.get("JETFLEET_NATS_URL", "nats://127.0.0.1:14222")
DEFAULT_REDIS = os.environ.get("JETFLEET_REDIS_URL", "redis://127.0.0.1:16379/0")


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    import uvloop

    return uvloop.run(coro)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nats", default=DEFAULT_NATS, help="NATS URL (env JETFLEET_NATS_URL)")
    p.add_argument("--subject-prefix", default="fleet", help="subject/stream prefix of the fleet")
    p.add_argument("--log-level", default=os.environ.get("JETFLEET_LOG_LEVEL", "info"))
    p.add_argument("--log-format", choices=["json", "console"], default="json")


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF-style model dir (default: shipped tiny card)")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--engine", choices=["mocker", "vllm"], default="mocker")
    p.add_argument("--speedup", type=float, default=1.0, help="mocker: simulated time divisor")
    p.add_argument("--num-gpu-blocks", type=int, default=16384)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--no-prefix-caching", action="store_true")


def _router_args(p: argparse.ArgumentParser) -> None:
    from router.policies import POLICY_NAMES

    p.add_argument("--router", choices=POLICY_NAMES, default="kv")
    p.add_argument("--redis", default=DEFAULT_REDIS, help="Redis URL (env JETFLEET_REDIS_URL)")
    p.add_argument(
        "--kv-prefill-weight",
        type=float,
        default=None,
        help="kv router: weight of blocks to prefill against decode load (default 8)",
    )
    p.add_argument(
        "--kv-prefill-overhead",
        type=int,
        default=None,
        help="kv router: what one prefill costs beyond its tokens, in blocks (default 4)",
    )
    p.add_argument(
        "--kv-temperature",
        type=float,
        default=None,
        help="kv router: softmax temperature over costs, in blocks (default 8; 0 = lowest wins)",
    )
    p.add_argument("--stall-timeout", type=float, default=60.0, help="seconds without a chunk")
    p.add_argument(
        "--max-waiting-per-worker",
        type=int,
        default=64,
        help="shed with 503 when every worker holds capacity + this many requests",
    )


def _vllm_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("vLLM engine (--engine vllm; pip install 'jetfleet[vllm]')")
    g.add_argument("--vllm-model", default=None, help="weights: HF id or dir (default --model)")
    g.add_argument("--tensor-parallel-size", type=int, default=1)
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--dtype", default="auto")
    g.add_argument("--quantization", default=None)
    g.add_argument("--enforce-eager", action="store_true")
    g.add_argument("--enable-sleep-mode", action="store_true")
    g.add_argument("--enable-lora", action="store_true")
    g.add_argument("--max-loras", type=int, default=4)
    g.add_argument("--max-lora-rank", type=int, default=16)
    g.add_argument("--no-kv-events", action="store_true", help="no KV events (no kv routing)")
    g.add_argument("--kv-events-endpoint", default="", help="PUB bind (default: ipc:// per worker)")
    g.add_argument("--kv-replay-endpoint", default="")
    g.add_argument("--kv-connector", default=None, help="disaggregation, e.g. NixlConnector")
    g.add_argument(
        "--kv-role", choices=["kv_both", "kv_producer", "kv_consumer"], default="kv_both"
    )
    g.add_argument(
        "--vllm-arg", action="append", default=[], metavar="KEY=VALUE",
        help="any other AsyncEngineArgs field (value parsed as JSON when it is JSON)",
    )  # fmt: skip


def _vllm_config(args: argparse.Namespace, model_dir: Path) -> Any:
    import json

    from workers.engines.vllm.config import VllmEngineConfig

    extra: dict[str, Any] = {}
    for item in args.vllm_arg:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"--vllm-arg expects KEY=VALUE, got {item!r}")
        try:
            extra[key] = json.loads(raw)
        except json.JSONDecodeError:
            extra[key] = raw
    return VllmEngineConfig(
        model=args.vllm_model or str(model_dir),
        block_size=args.block_size,
        tensor_parallel_size=args.tensor_parallel_size,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        dtype=args.dtype,
        quantization=args.quantization,
        enforce_eager=args.enforce_eager,
        enable_sleep_mode=args.enable_sleep_mode,
        enable_lora=args.enable_lora,
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
        kv_events=not args.no_kv_events,
        kv_events_endpoint=args.kv_events_endpoint,
        kv_replay_endpoint=args.kv_replay_endpoint,
        kv_connector=args.kv_connector,
        kv_role=args.kv_role,
        extra_engine_args=extra,
    )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="jetfleet", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)

    up = sub.add_parser("up", help="run the whole local fleet on embedded servers")
    _common(up)
    _engine_args(up)
    _router_args(up)
    up.add_argument("--workers", type=int, default=2)
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8000)
    up.add_argument("--nats-port", type=int, default=14222)
    up.add_argument("--redis-port", type=int, default=16379)
    up.add_argument("--state-dir", default=".jetfleet", help="server data and process logs")
    up.add_argument(
        "--planner",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="autoscale (default): planner + local connector own the workers, --workers is "
        "the start; --no-planner: a fixed fleet of --workers",
    )
    from planner.settings import add_planner_args

    add_planner_args(up)

    srv = sub.add_parser("servers", help="run only the embedded NATS and Redis")
    _common(srv)
    srv.add_argument("--nats-port", type=int, default=14222)
    srv.add_argument("--redis-port", type=int, default=16379)
    srv.add_argument("--state-dir", default=".jetfleet")

    infra = sub.add_parser("infra", help="infrastructure")
    isub = infra.add_subparsers(dest="infra_cmd", required=True)
    init = isub.add_parser("init", help="create or update all streams, buckets, object stores")
    _common(init)
    init.add_argument("--replicas", type=int, default=1)

    fe = sub.add_parser("frontend", help="OpenAI-compatible HTTP frontend")
    _common(fe)
    _router_args(fe)
    fe.add_argument("--host", default="127.0.0.1")
    fe.add_argument("--port", type=int, default=8000)
    fe.add_argument(
        "--api-key",
        action="append",
        default=[],
        help="require this bearer key on /v1/* (repeatable; env JETFLEET_API_KEYS)",
    )

    wk = sub.add_parser("worker", help="a worker process (mocker or vllm engine)")
    _common(wk)
    _engine_args(wk)
    wk.add_argument("--role", choices=["agg", "prefill", "decode"], default="agg")
    wk.add_argument("--worker-id", default=None)
    wk.add_argument("--metrics-port", type=int, default=0, help="/metrics and /health (0: off)")
    wk.add_argument("--metrics-host", default="127.0.0.1", help="0.0.0.0 in a pod (probes)")
    _vllm_args(wk)
    wk.add_argument(
        "--flush-interval-ms",
        type=float,
        default=5.0,
        help="longest a token waits before it is published, at light load",
    )
    wk.add_argument(
        "--max-flush-interval-ms",
        type=float,
        default=20.0,
        help="the same under a full batch (the window grows with the batch)",
    )

    ix = sub.add_parser("indexer", help="KV indexer: FLEET_KV -> Redis prefix index")
    _common(ix)
    ix.add_argument("--redis", default=DEFAULT_REDIS, help="Redis URL (env JETFLEET_REDIS_URL)")
    ix.add_argument("--metrics-port", type=int, default=0)
    ix.add_argument(
        "--snapshot-every",
        type=float,
        default=60.0,
        help="seconds between index snapshots to the object store (0: off)",
    )

    rs = sub.add_parser("router-service", help="route requests NATS clients submit")
    _common(rs)
    _router_args(rs)

    pub = sub.add_parser("publish", help="submit a request over NATS only and stream the answer")
    _common(pub)
    pub.add_argument("prompt", help="user message (chat template applied) or raw text with --raw")
    pub.add_argument("--model", default=None, help="served model name (default: the only one)")
    pub.add_argument("--max-tokens", type=int, default=64)
    pub.add_argument("--seed", type=int, default=None)
    pub.add_argument("--raw", action="store_true", help="no chat template")
    pub.add_argument("--json", action="store_true", help="print each TokenChunk as JSON")

    st = sub.add_parser("status", help="the live fleet")
    _common(st)
    st.add_argument("--json", action="store_true")

    from infra import cli_planner

    cli_planner.add_commands(sub, _common, _engine_args)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from infra.logs import configure_logging

    configure_logging(args.log_level, args.log_format)
    from schemas import Subjects

    subjects = Subjects(args.subject_prefix)
    if args.cmd == "up":
        from infra.up import run_up

        return run_up(args, subjects)
    if args.cmd == "servers":
        from infra.up import run_servers

        return run_servers(args)
    if args.cmd == "infra":
        from infra.tools import infra_init

        return int(_run(infra_init(args.nats, subjects, args.replicas)))
    if args.cmd == "frontend":
        return _frontend(args, subjects)
    if args.cmd == "worker":
        return _worker(args, subjects)
    if args.cmd == "router-service":
        from router.service import RouterServiceConfig, run_router_service

        cfg = RouterServiceConfig(
            args.nats, subjects, args.router, _redis_for(args), kv=_kv_config(args)
        )
        _run(run_router_service(cfg))
        return 0
    if args.cmd == "indexer":
        from router.indexer import IndexerConfig, run_indexer

        _run(
            run_indexer(
                IndexerConfig(
                    args.nats,
                    args.redis,
                    subjects,
                    metrics_port=args.metrics_port,
                    snapshot_every_s=args.snapshot_every,
                )
            )
        )
        return 0
    if args.cmd == "publish":
        from infra.tools import publish

        return int(_run(publish(args, subjects)))
    from infra import cli_planner

    if args.cmd in cli_planner.COMMANDS:
        return cli_planner.run(args, subjects, _run)
    if args.cmd == "status":
        from infra.tools import status

        return int(_run(status(args.nats, subjects, args.json)))
    return 2


def _redis_for(args: argparse.Namespace) -> str | None:
    return str(args.redis) if args.router == "kv" else None


def _kv_config(args: argparse.Namespace) -> Any:
    from router.kv.router import KvRouterConfig

    given = {
        "prefill_weight": args.kv_prefill_weight,
        "prefill_overhead_blocks": args.kv_prefill_overhead,
        "temperature": args.kv_temperature,
    }
    return KvRouterConfig(**{k: v for k, v in given.items() if v is not None})


def _frontend(args: argparse.Namespace, subjects: Any) -> int:
    from router.client import ClientConfig
    from router.frontend.app import FrontendConfig
    from router.frontend.service import FrontendServiceConfig, run_frontend

    keys = tuple(args.api_key) + tuple(
        k for k in os.environ.get("JETFLEET_API_KEYS", "").split(",") if k
    )
    cfg = FrontendServiceConfig(
        nats_url=args.nats,
        host=args.host,
        port=args.port,
        router=args.router,
        redis_url=_redis_for(args),
        kv=_kv_config(args),
        subjects=subjects,
        client=ClientConfig(
            stall_timeout_s=args.stall_timeout, max_waiting_per_worker=args.max_waiting_per_worker
        ),
        http=FrontendConfig(api_keys=keys),
    )
    _run(run_frontend(cfg))
    return 0


def _worker(args: argparse.Namespace, subjects: Any) -> int:
    from router.modelcard import default_model_dir, load_model_dir
    from workers.config import WorkerConfig, new_worker_id
    from workers.engines.mocker.config import MockerConfig
    from workers.main import EngineChoice, run_worker

    model_dir = Path(args.model) if args.model else default_model_dir()
    local = load_model_dir(model_dir, args.served_model_name, args.block_size)
    cfg = WorkerConfig(
        nats_url=args.nats,
        model_dir=model_dir,
        model_name=local.name,
        role=args.role,
        engine=args.engine,
        subjects=subjects,
        worker_id=args.worker_id or new_worker_id(),
        flush_interval_s=args.flush_interval_ms / 1000.0,
        max_flush_interval_s=args.max_flush_interval_ms / 1000.0,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        block_size=args.block_size,
    )
    mocker = MockerConfig(
        num_gpu_blocks=args.num_gpu_blocks,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=not args.no_prefix_caching,
        speedup=args.speedup,
    )
    vllm = _vllm_config(args, model_dir) if args.engine == "vllm" else None
    from workers.engines.vllm.backend import VllmNotInstalledError

    try:
        _run(run_worker(cfg, EngineChoice(args.engine, mocker, vllm), local))
    except VllmNotInstalledError as exc:
        print(f"jetfleet worker: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
