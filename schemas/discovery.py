"""Discovery: JetStream KV buckets ``fleet_workers`` and ``fleet_models``.

A worker puts its ``WorkerRegistration`` under its worker id every ``heartbeat_interval_s``; a
reader treats an entry older than ``ttl_s`` as gone (the bucket's own max age also removes it), so
a worker that stops heartbeating leaves routing within a few seconds. A clean shutdown first
publishes ``status="draining"`` (routers stop sending), then deletes the key.

Workers publish the ``ModelCard`` of what they serve under the model's subject token; frontends
load the tokenizer and chat template from it, so a frontend needs no model files of its own.
Large files (``tokenizer.json``) travel in the object store ``fleet_model_files``.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from schemas.hashing import DEFAULT_BRANCH_BLOCKS

WorkerRole = Literal["agg", "prefill", "decode"]
BY_HAND = "hand"  # WorkerRegistration.managed_by of a worker no connector started
WorkerStatus = Literal["ready", "draining"]


class WorkerRegistration(msgspec.Struct, frozen=True, omit_defaults=True):
    worker_id: str
    model: str  # served model name
    role: WorkerRole
    engine: str  # "mocker" | "vllm"
    max_num_seqs: int  # concurrent sequences the engine batches
    num_gpu_blocks: int  # KV blocks in the engine's pool
    block_size: int  # tokens per KV block
    status: WorkerStatus = "ready"
    heartbeat_at_s: float = 0.0  # wall clock of this heartbeat
    heartbeat_interval_s: float = 1.0
    ttl_s: float = 5.0  # readers drop the worker when heartbeat_at_s is older than this
    started_at_s: float = 0.0
    host: str = ""
    pid: int = 0
    metrics_url: str = ""  # the worker's operations port (/metrics, /health, /ready), if served
    # Who started the worker and may stop it: a planner connector kind ("local", "kubernetes"),
    # or "hand" (the planner counts it but never relies on it); "" only from workers older
    # than the field (counted as managed: nothing is known against it).
    managed_by: str = ""
    # LoRA adapters loaded on the worker: a request for one goes only to workers listing it
    loras: tuple[str, ...] = ()
    # the branch point of its block hashes (``schemas.hashing``): how a router hashes prompts
    kv_branch_blocks: int = DEFAULT_BRANCH_BLOCKS
    # how it honours a structured-output constraint: "logits" (it masks them: any constraint
    # its backend compiles) or "instances" (it writes an instance: only the JSON Schema subset
    # ``model.structured`` satisfies; a frontend refuses the rest with a 400)
    structured: str = "logits"
    v: int = 1


class OpsEndpoint(msgspec.Struct, frozen=True, omit_defaults=True):
    """A fleet service's operations port (``/metrics``, ``/health``, ``/ready``), kept in the
    bucket ``fleet_ops_endpoints`` under ``{component}.{instance}`` while the service runs, so
    that a frontend's ``/discovery/prometheus`` lists it (workers are listed from their
    registrations instead)."""

    component: str  # "router" | "indexer" | "planner" | "connector"
    instance: str  # unique among the component's processes (its id, or host-pid)
    url: str  # http://host:port
    model: str = ""  # the model a planner or a connector serves
    at_s: float = 0.0  # wall clock of the put (a reader drops an entry not put again in 30 s)
    v: int = 1


class ModelCard(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a frontend needs to serve a model: template, limits, and where the tokenizer is."""

    name: str  # served model name, as clients send it in "model"
    context_length: int  # max prompt + completion tokens
    block_size: int  # KV block size used for prefix hashing
    tokenizer_object: str  # object name in the fleet_model_files store (tokenizer.json)
    tokenizer_sha256: str
    chat_template: str | None = None  # jinja2 source
    bos_token: str | None = None
    eos_token: str | None = None
    eos_token_ids: tuple[int, ...] = ()
    created_at_s: float = 0.0
    tool_call_parser: str | None = None  # how the model writes tool calls (hermes, ...)
    reasoning_parser: str | None = None  # how it writes reasoning (deepseek_r1, qwen3)
    tasks: tuple[str, ...] = ("generate",)  # what its workers answer: "generate", "embed"
    hidden_size: int = 0  # the embedding size (0: unknown)
    matryoshka_dimensions: tuple[int, ...] | None = None  # sizes ``dimensions`` may ask; ()=any
    kv_branch_blocks: int = DEFAULT_BRANCH_BLOCKS  # how its workers hash blocks (schemas.hashing)
    v: int = 1
