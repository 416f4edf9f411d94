"""Each component's command-line flags, declared once from its config class (``flags.py``).

The ``jetfleet`` commands add these sets to their parsers and build the configs from them;
``jetfleet up`` and the local connector pass them on to the processes they start.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from infra.cli.flags import ConfigFlags, Flag
from router.client import ClientConfig
from router.disagg import DisaggConfig
from router.frontend.http import FrontendConfig
from router.frontend.service import FrontendServiceConfig
from router.frontend.tokenize import TokenizeConfig
from router.indexer import IndexerConfig
from router.kv.router import KvRouterConfig
from router.policies import POLICY_NAMES
from router.stack import StackConfig
from schemas import Subjects
from workers.config import WorkerConfig
from workers.engines.mocker.config import MockerConfig
from workers.engines.vllm.config import VllmEngineConfig

DEFAULT_NATS = os.environ.get("JETFLEET_NATS_URL", "nats://127.0.0.1:14222")
DEFAULT_REDIS = os.environ.get("JETFLEET_REDIS_URL", "redis://127.0.0.1:16379/0")
REDIS_HELP = (
    "Redis URL: redis://, rediss://, unix:// or, for Sentinel, "
    "redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB] (env JETFLEET_REDIS_URL)"
)

MOCKER = ConfigFlags(
    MockerConfig,
    "num_gpu_blocks",
    Flag(
        "block_size",
        default=None,
        help="tokens per KV block (default: 16 for the mocker, 32 for vLLM, whose CPU build "
        "pages in multiples of 32)",
    ),
    "max_num_seqs",
    Flag(
        "max_num_batched_tokens",
        default=None,
        help="prompt tokens one engine step takes (default: the engine's own: the mocker's "
        "8192, vLLM's for its platform, 2048 on a CPU)",
    ),
    Flag("enable_prefix_caching", "--prefix-caching"),
    Flag("enable_chunked_prefill", "--chunked-prefill"),
    Flag("speedup", help="mocker: divisor of simulated time (1 = real time)"),
    "watermark",
    "kv_transfer_bandwidth",
    "kv_transfer_mode",
    "kv_block_bytes",
    "kv_hold_timeout_s",
    "num_cpu_blocks",
    "kv_offload_bandwidth",
    "kv_branch_blocks",
    title="engine (the mocker's flags; vLLM reads the shared ones too)",
)

VLLM = ConfigFlags(
    VllmEngineConfig,
    Flag("model", "--vllm-model", help="weights: HF id or dir (default: --model)"),
    Flag("block_size", default=None),  # the mocker's flag: resolved by engine
    "max_num_seqs",
    "max_num_batched_tokens",
    "scheduling_policy",
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "max_model_len",
    "dtype",
    Flag("quantization", help="vLLM's quantization method (default: the model's)"),
    "enforce_eager",
    "enable_sleep_mode",
    Flag("enable_lora", help="serve LoRA adapters (load and unload control ops)"),
    "max_loras",
    "max_lora_rank",
    "kv_events",
    "kv_events_endpoint",
    "kv_replay_endpoint",
    "kv_connector",
    "kv_role",
    "kv_offloading_size",
    "kv_offloading_backend",
    Flag("cpu_kv_cache_gib", help="CPU build: KV cache in whole GiB (default: 1)"),
    Flag(
        "cpu_threads",
        help="CPU build: model threads (default: all cores; up: the cores shared out among the "
        "workers it starts with, less one for the fleet from 4 cores on)",
    ),
    Flag(
        "cpu_cores",
        help="CPU build: the cores this worker and its engine run on, a CPU list like 0-3,8 "
        "(default: where the OS puts them; up: cores of its own for each engine it starts, "
        "when there are two or more or a core is kept for the fleet, with the planner for the "
        "most it may run; none: never pinned)",
    ),
    title="vLLM engine (--engine vllm; bash infra/bootstrap.sh vllm sets it up)",
)
# tokens per KV block when --block-size is not given: vLLM's CPU build needs a multiple of 32
ENGINE_BLOCK_SIZE = {"mocker": 16, "vllm": 32}
# how long a worker may take to start and register (a real model loads for minutes on a CPU)
ENGINE_START_TIMEOUT_S = {"mocker": 60.0, "vllm": 900.0}
# what --engine vllm serves without --model: built once from a registry package (vllm_models.py)
VLLM_DEFAULT_MODEL = "smollm2"

WORKER = ConfigFlags(
    WorkerConfig,
    "role",
    Flag("worker_id", help="unique id in the fleet (default: a new random one)"),
    "metrics_port",
    "metrics_host",
    Flag(
        "managed_by",
        help="the planner connector that started this worker (local, kubernetes), or hand: "
        "the planner counts it but keeps its minimum without it",
    ),
    Flag("flush_interval_s", "--flush-interval-ms", scale=1000.0),
    Flag("max_flush_interval_s", "--max-flush-interval-ms", scale=1000.0),
    Flag("kv_flush_interval_s", "--kv-flush-interval-ms", scale=1000.0),
    "heartbeat_interval_s",
    "load_interval_s",
    "load_keepalive_s",
    "ttl_s",
    "ack_wait_s",
    "drain_timeout_s",
    "max_pending_requests",
    "kv_branch_blocks",
    title="worker",
)

KV = ConfigFlags(
    KvRouterConfig,
    "prefill_weight",
    Flag("prefill_overhead_blocks", "--kv-prefill-overhead"),
    "temperature",
    "reservation_ttl_s",
    "hint_ttl_s",
    "load_report_max_age_s",
    "host_hit_weight",
    "redis_fallback",
    "sample",
    "max_holders",
    "pool_refresh_s",
    prefix="kv_",
    title="kv router (--router kv / approx)",
)

CLIENT = ConfigFlags(
    ClientConfig,
    "stall_timeout_s",
    "max_attempts",
    "max_waiting_per_worker",
    "hold_waiting_per_worker",
    "wait_for_worker_s",
    title="requests in flight",
)

DISAGG = ConfigFlags(
    DisaggConfig,
    Flag("policy", "--disagg-policy"),
    Flag("isl_threshold", "--disagg-isl-threshold"),
    "prefill_queue_limit",
    Flag("prefill_timeout_s", "--prefill-timeout"),
    Flag("local_on_prefill_workers", "--disagg-local-on-prefill-workers"),
    title="disaggregated serving (models with decode workers)",
)

FRONTEND = ConfigFlags(
    FrontendConfig,
    Flag(
        "api_keys",
        "--api-key",
        help="require this bearer key on /v1/* (repeatable; env JETFLEET_API_KEYS)",
    ),
    "retry_after_s",
    "max_body_mb",
    "access_log",
    "max_file_mb",
    "batch_concurrency",
    "batch_pace",
    "batch_ttft_slack",
    "batch_window_s",
    "takeover_lease_s",
    title="HTTP",
)

TOKENIZE = ConfigFlags(
    TokenizeConfig,
    Flag("cache_tokens", "--tokenizer-cache-tokens"),
    Flag("split_chars", "--tokenizer-split-chars"),
    title="HTTP",
)

FRONTEND_SERVICE = ConfigFlags(
    FrontendServiceConfig,
    "host",
    "port",
    "keep_alive_s",
    "reuse_port",
    title="HTTP server",
)

INDEXER = ConfigFlags(
    IndexerConfig,
    "batch_max",
    "leader_ttl_ms",
    "metrics_port",
    "metrics_host",
    Flag("snapshot_every_s", "--snapshot-every"),
    Flag("reconcile_every_s", "--reconcile-every"),
    "index_shards",
    Flag("groups", "--indexer-groups"),
    Flag("group", "--indexer-group"),
    "max_blocks_per_call",
    Flag("sweep_every_s", "--sweep-every"),
    Flag("stall_after_s", "--stall-after"),
    title="indexer",
)


def add_common(p: argparse.ArgumentParser, nats: bool = True) -> None:
    if nats:
        p.add_argument("--nats", default=DEFAULT_NATS, help="NATS URL (env JETFLEET_NATS_URL)")
    p.add_argument("--subject-prefix", default="fleet", help="subject/stream prefix of the fleet")
    p.add_argument(
        "--log-level",
        default=os.environ.get("JETFLEET_LOG_LEVEL", "info"),
        help="debug, info, warning or error (env JETFLEET_LOG_LEVEL)",
    )
    p.add_argument(
        "--log-format",
        choices=["json", "console"],
        default="json",
        help="json: one structlog JSON object a line; console: for humans",
    )


def common_argv(args: argparse.Namespace) -> list[str]:
    out = ["--subject-prefix", args.subject_prefix, "--log-level", args.log_level]
    out += ["--log-format", args.log_format]
    return (["--nats", args.nats] if getattr(args, "nats", None) else []) + out


def add_model(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default=None, help="HF-style model dir (default: shipped tiny card)")
    g.add_argument(
        "--served-model-name", default=None, help="the name clients send (default: the dir's name)"
    )
    g.add_argument(
        "--engine",
        choices=["mocker", "vllm"],
        default="mocker",
        help="mocker: the simulated engine; vllm: vLLM (its CPU build where there is no GPU)",
    )
    g.add_argument(
        "--tool-call-parser",
        default=None,
        help="how this model writes tool calls: hermes, llama3_json, mistral, qwen3_coder, "
        "pythonic (default: the model dir's jetfleet.json, else none: tool_choice auto is refused)",
    )
    g.add_argument(
        "--reasoning-parser",
        default=None,
        help="how this model writes its reasoning: deepseek_r1, qwen3 (default: the model dir's "
        "jetfleet.json, else none)",
    )


MODEL_FLAGS = ("model", "served_model_name", "engine", "tool_call_parser", "reasoning_parser")


def add_engine(p: argparse.ArgumentParser) -> None:
    """The model and the engines' flags (what a worker pool is started with)."""
    add_model(p)
    MOCKER.add_to(p)
    VLLM.add_to(p)
    p.add_argument(
        "--vllm-arg", action="append", default=[], metavar="KEY=VALUE",
        help="any other AsyncEngineArgs field (value parsed as JSON when it is JSON)",
    )  # fmt: skip


def resolve_engine_defaults(args: argparse.Namespace) -> None:
    """The defaults that depend on the engine (the block size), once the flags are parsed."""
    engine = getattr(args, "engine", None)
    if engine is not None and getattr(args, "block_size", 0) is None:
        args.block_size = ENGINE_BLOCK_SIZE[engine]


def ensure_engine_model(args: argparse.Namespace, say: Callable[[str], None]) -> None:
    """``--engine vllm`` with no ``--model``: the real model, built once into the cache (``say``
    reports the build)."""
    if getattr(args, "engine", None) != "vllm" or args.model or getattr(args, "vllm_model", None):
        return
    from infra.vllm_models import ensure

    args.model = str(ensure(VLLM_DEFAULT_MODEL, say))


def engine_argv(args: argparse.Namespace) -> list[str]:
    """The model and engine flags that start workers like the ones ``args`` describe."""
    out: list[str] = []
    for name in MODEL_FLAGS:
        value = getattr(args, name, None)
        if value is not None and not (name == "engine" and value == "mocker"):
            out += ["--" + name.replace("_", "-"), str(value)]
    engine = getattr(args, "engine", None) or "mocker"
    # the child resolves the same engine default itself
    default_block = getattr(args, "block_size", None) == ENGINE_BLOCK_SIZE[engine]
    out += MOCKER.argv(args, exclude=frozenset({"--block-size"} if default_block else ()))
    if engine == "vllm":
        out += VLLM.argv(args, exclude=MOCKER.flags)
        for item in args.vllm_arg:
            out += ["--vllm-arg", item]
    return out


def add_routing(
    p: argparse.ArgumentParser, redis_default: str | None = DEFAULT_REDIS, redis_help: str = ""
) -> None:
    g = p.add_argument_group("routing")
    g.add_argument(
        "--router",
        choices=POLICY_NAMES,
        default="kv",
        help="routing policy (see docs/operating/running.md)",
    )
    g.add_argument("--redis", default=redis_default, help=redis_help or REDIS_HELP)
    KV.add_to(p)


def routing_stack(args: argparse.Namespace, subjects: Subjects) -> StackConfig:
    """The routing stack a frontend or router service runs, from the routing, kv, client and
    disaggregation flags (``routing_argv`` gives them back)."""
    return StackConfig(
        args.nats,
        subjects,
        args.router,
        redis_for(args),
        KV.build(args),
        CLIENT.build(args),
        DISAGG.build(args),
    )


def routing_argv(args: argparse.Namespace) -> list[str]:
    return ["--router", str(args.router), *KV.argv(args), *CLIENT.argv(args), *DISAGG.argv(args)]


def redis_for(args: argparse.Namespace) -> str | None:
    """The Redis URL when the router needs Redis (``kv``), else None."""
    return str(args.redis) if args.router == "kv" else None
