"""CLI tools: ``infra init``, ``publish`` (a NATS-only client) and ``status``."""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from typing import Any

from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError

from base.connect import connect_nats
from base.kv_read import bucket_values
from base.topology import ensure_topology
from schemas import (
    ControlReply,
    ControlRequest,
    ModelCard,
    Request,
    SamplingParams,
    Subjects,
    TokenChunk,
    WireDecodeError,
    WorkerLoad,
    WorkerRegistration,
    decode,
    encode,
    to_builtins,
)
from schemas.requests import submit_msg_id
from schemas.streams import (
    HEARTBEATS_BUCKET,
    MODEL_FILES_STORE,
    MODELS_BUCKET,
    ResponsesRetention,
)
from schemas.token_reader import TokenReader

# a one-shot command: a NATS that cannot be reached is an error after this many tries (0.5 s
# apart, each server of a cluster URL), not an endless wait
INIT_CONNECT_ATTEMPTS = 20


async def infra_init(
    nats_url: str,
    subjects: Subjects,
    replicas: int,
    responses: ResponsesRetention | None = None,
    quiet: bool = False,
) -> int:
    nc = await connect_tool(nats_url, "jetfleet-infra-init", attempts=INIT_CONNECT_ATTEMPTS)
    try:
        report = await ensure_topology(nc.jetstream(), subjects, replicas, responses)
    finally:
        await nc.close()
    if not quiet:
        print(
            json.dumps(
                to_builtins(report) if not isinstance(report, dict) else report,
                default=str,
                indent=2,
            )
        )
    return 0


class NoFleetError(LookupError):
    """No fleet under this subject prefix on this NATS server (its buckets do not exist)."""


async def load_cards(js: JetStreamContext, subjects: Subjects) -> dict[str, ModelCard]:
    """The model cards of the fleet; ``NoFleetError`` when the prefix has no fleet at all."""
    try:
        kv = await js.key_value(subjects.bucket_name(MODELS_BUCKET))
    except BucketNotFoundError as exc:
        raise NoFleetError(
            f"no fleet under subject prefix {subjects.prefix!r} on this NATS server (no "
            f"{subjects.bucket_name(MODELS_BUCKET)} bucket): check --nats and --subject-prefix"
        ) from exc
    cards = [decode(value, ModelCard) for value in (await bucket_values(kv)).values() if value]
    return {card.name: card for card in cards}


async def publish(args: argparse.Namespace, subjects: Subjects) -> int:
    from model.tokenizer import ModelTokenizer

    nc = await connect_tool(args.nats, "jetfleet-publish")
    js = nc.jetstream()
    try:
        cards = await load_cards(js, subjects)
        if not cards:
            print("no model is registered in this fleet", file=sys.stderr)
            return 1
        name = args.model or (next(iter(cards)) if len(cards) == 1 else None)
        if name not in cards:
            print(f"choose --model from: {', '.join(sorted(cards))}", file=sys.stderr)
            return 1
        card = cards[name]
        store = await js.object_store(subjects.bucket_name(MODEL_FILES_STORE))
        tok_json = (await store.get(card.tokenizer_object)).data
        if tok_json is None:
            print(f"the tokenizer of {name} is missing from the model store", file=sys.stderr)
            return 1
        tok = ModelTokenizer(tok_json, card.chat_template, card.bos_token, card.eos_token)
        text = (
            args.prompt
            if args.raw
            else tok.apply_chat_template(
                [{"role": "user", "content": args.prompt}], add_generation_prompt=True
            )
        )
        request = Request(
            request_id=f"pub-{uuid.uuid4().hex}",
            model=name,
            token_ids=tuple(tok.encode(text)),
            sampling=SamplingParams(max_tokens=args.max_tokens, seed=args.seed),
            created_at_s=time.time(),
        )
        sub = await nc.subscribe(subjects.tok(request.request_id))  # subscribe first
        await js.publish(
            subjects.submit(name),
            encode(request),
            headers={"Nats-Msg-Id": submit_msg_id(request.request_id)},
        )
        reader = TokenReader()  # repeats and older attempts dropped, cut back on a migration
        while True:
            chunk = decode((await sub.next_msg(timeout=120)).data, TokenChunk)
            cut = reader.take(chunk)
            if cut is None:
                continue
            if args.json:
                if cut:
                    print(json.dumps({"cut_tokens": cut}), flush=True)
                print(json.dumps(to_builtins(chunk)), flush=True)
            elif cut:  # the old worker's last tokens were taken back: the answer again
                print(f"\n[moved to another worker]\n{reader.text}", end="", flush=True)
            else:
                print(chunk.text, end="", flush=True)
            if chunk.finish_reason is not None:
                if reader.missing() or reader.behind:
                    print(
                        f"missed while disconnected: chunks {reader.missing()}, "
                        f"{reader.behind} earlier tokens (jetfleet replay request "
                        f"{request.request_id})",
                        file=sys.stderr,
                    )
                if not args.json:
                    print(
                        f"\n[finish_reason={chunk.finish_reason}"
                        f"{' error=' + chunk.error if chunk.error else ''}]"
                    )
                return 0 if chunk.finish_reason != "error" else 1
    finally:
        await nc.close()


async def fleet_status(nc: NATS, subjects: Subjects) -> dict[str, Any]:
    """Workers and models as the buckets hold them, each bucket read whole to its last sequence
    (``bucket_values``): neither a key listing that fails under load nor a watch's end marker
    that comes before its values (nats-io/nats.py#842) may read as fewer workers or models than
    the buckets hold; a bucket not read in time is an error."""
    js = nc.jetstream()
    # the models bucket first: it is the last bucket a fleet's topology makes, so a fleet still
    # being set up (its first component starting) reads as no fleet yet, never as half of one
    cards = await load_cards(js, subjects)
    try:
        heartbeats = await js.key_value(subjects.bucket_name(HEARTBEATS_BUCKET))
    except BucketNotFoundError as exc:  # a bucket deleted under a running fleet
        raise NoFleetError(f"no fleet under subject prefix {subjects.prefix!r}: {exc}") from exc
    regs: list[WorkerRegistration] = []
    for key, value in (await bucket_values(heartbeats)).items():
        try:
            regs.append(decode(value, WorkerRegistration))
        except WireDecodeError as exc:  # one bad entry is not the whole fleet
            print(f"jetfleet: registration {key} unreadable, left out: {exc}", file=sys.stderr)
    workers: list[dict[str, Any]] = []
    now = time.time()
    for reg in regs:
        age = now - reg.heartbeat_at_s
        row: dict[str, Any] = {
            "worker_id": reg.worker_id,
            "model": reg.model,
            "role": reg.role,
            "engine": reg.engine,
            "status": reg.status if age <= reg.ttl_s else "expired",
            "heartbeat_age_s": round(age, 2),
            "max_num_seqs": reg.max_num_seqs,
            "num_gpu_blocks": reg.num_gpu_blocks,
            "block_size": reg.block_size,
            "metrics_url": reg.metrics_url or None,
            "host": reg.host,
            "pid": reg.pid,
            "managed_by": reg.managed_by or None,  # "hand", a connector kind; None: unknown
        }
        try:
            raw = await js.get_last_msg(
                subjects.stream_name("METRICS"),
                subjects.metrics(reg.model, reg.role, reg.worker_id),
            )
            load = decode(raw.data or b"", WorkerLoad)
            row.update(
                num_running=load.num_running,
                num_waiting=load.num_waiting,
                kv_usage=round(load.kv_usage, 4),
                num_cpu_blocks=load.num_cpu_blocks,
                host_kv_usage=round(load.host_kv_usage, 4) if load.num_cpu_blocks else None,
                prefix_cache_hit_rate=round(load.prefix_cache_hit_rate, 4),
                load_age_s=round(now - load.ts_s, 2),
            )
        except Exception:
            row.update(num_running=None, num_waiting=None, kv_usage=None, host_kv_usage=None)
        workers.append(row)
    models = [
        {
            "name": c.name,
            "context_length": c.context_length,
            "block_size": c.block_size,
            "workers": sum(1 for w in workers if w["model"] == c.name and w["status"] != "expired"),
            "pools": _pools(workers, c.name),
            "tasks": list(c.tasks),
        }
        for c in cards.values()
    ]
    return {"models": models, "workers": sorted(workers, key=lambda w: w["worker_id"])}


async def connect_tool(url: str, name: str, attempts: int = 1) -> NATS:
    """A command-line tool's connection: ``SystemExit`` with a clear line when NATS does not
    answer after ``attempts`` retries, 0.5 s apart (nats-py reads 0 as no limit, like -1: the
    first connect would be tried forever)."""
    try:
        return await connect_nats(
            url,
            name=name,
            allow_reconnect=False,
            max_reconnect_attempts=max(attempts, 1),
            connect_timeout=3,
        )
    except Exception as exc:
        raise SystemExit(f"cannot reach NATS at {url}: {exc or type(exc).__name__}") from None


def _pools(workers: list[dict[str, Any]], model: str) -> dict[str, int]:
    """Live workers of ``model`` per role (a disaggregated model: a prefill and a decode pool)."""
    pools: dict[str, int] = {}
    for w in workers:
        if w["model"] == model and w["status"] != "expired":
            pools[w["role"]] = pools.get(w["role"], 0) + 1
    return dict(sorted(pools.items()))


async def control(
    nats_url: str,
    subjects: Subjects,
    worker_id: str,
    op: str,
    args: dict[str, str],
    timeout_s: float,
) -> int:
    """``jetfleet ctl``: one control op on one worker; its reply as JSON (exit 1 if not ok)."""
    nc = await connect_tool(nats_url, "jetfleet-ctl")
    try:
        msg = await nc.request(
            subjects.ctl(worker_id, op), encode(ControlRequest(args=args)), timeout_s
        )
    except (NoRespondersError, NatsTimeoutError):
        print(f"jetfleet ctl: no answer from worker {worker_id!r}", file=sys.stderr)
        return 1
    finally:
        await nc.close()
    reply = decode(msg.data, ControlReply)
    print(json.dumps(to_builtins(reply), indent=2))
    return 0 if reply.ok else 1


async def status(nats_url: str, subjects: Subjects, as_json: bool) -> int:
    nc = await connect_tool(nats_url, "jetfleet-status")
    try:
        report = await fleet_status(nc, subjects)
    finally:
        await nc.close()
    if as_json:
        print(json.dumps(report, indent=2))
        return 0
    for m in report["models"]:
        pools = ", ".join(f"{n} {role}" for role, n in m["pools"].items()) or "none"
        print(
            f"model {m['name']}: {m['workers']} live workers ({pools}), context "
            f"{m['context_length']}, serves {', '.join(m['tasks'])}"
        )
    print(
        f"{'WORKER':<14} {'MODEL':<16} {'ROLE':<7} {'STATUS':<9} {'RUN':>4} {'WAIT':>5} "
        f"{'KV%':>6} {'HOST%':>6} {'HB AGE':>7} {'BY':<10} METRICS"
    )
    for w in report["workers"]:
        kv = "-" if w["kv_usage"] is None else f"{100 * w['kv_usage']:.1f}"
        host = "-" if w["host_kv_usage"] is None else f"{100 * w['host_kv_usage']:.1f}"
        print(
            f"{w['worker_id']:<14} {w['model']:<16} {w['role']:<7} {w['status']:<9} "
            f"{w['num_running'] if w['num_running'] is not None else '-':>4} "
            f"{w['num_waiting'] if w['num_waiting'] is not None else '-':>5} {kv:>6} {host:>6} "
            f"{w['heartbeat_age_s']:>6.1f}s {w['managed_by'] or '?':<10} "
            f"{w['metrics_url'] or '-'}"
        )
    return 0
