"""Discovery for one worker: model card, registration, heartbeats, load reports, stop requests.

The registration (``fleet_workers``) is put when the worker registers, when it changes (status,
adapters) and every ``REGISTRATION_REFRESH_S``; the heartbeat (the same registration, fresh) goes
to ``fleet_heartbeats`` every heartbeat interval. The frontends follow the registrations, the
judges of liveness (indexers, planners) the heartbeats: a frontend hears a worker join and leave,
not every beat of every worker (``base/worker_watch.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import socket
import time
from typing import Any

import msgspec
import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from base.cancelling import cancel_and_wait
from model.card import LocalModel, to_model_card
from schemas import ModelCard, WorkerLoad, WorkerRegistration, encode, model_token
from schemas.discovery import WorkerStatus
from schemas.streams import HEARTBEATS_BUCKET, MODEL_FILES_STORE, MODELS_BUCKET, WORKERS_BUCKET
from workers.config import WorkerConfig
from workers.engine import Engine, EngineLoad

log = structlog.get_logger("jetfleet.worker")

# A registration is put again this often (the bucket keeps it an hour): a judge deletes a dead
# worker's at once, and puts back the registration of one whose heartbeats come again
REGISTRATION_REFRESH_S = 300.0


class Registry:
    def __init__(
        self, cfg: WorkerConfig, js: JetStreamContext, engine: Engine, nc: NATS | None = None
    ) -> None:
        """``nc``: heartbeats are published on it without waiting for the stream's ack (a lost
        one is followed by the next within a second; with 1,024 workers a process spent most
        of its idle CPU on the acks); without it they are acknowledged puts."""
        self.metrics_url = ""  # set when the operations port is up
        self.cfg = cfg
        self.nc = nc
        self.js = js
        self.engine = engine
        self.status: WorkerStatus = "ready"
        self.stop_requested = asyncio.Event()
        self._kv: Any = None
        self._beats: Any = None
        self._task: asyncio.Task[None] | None = None
        self._beating = True
        self._started_at = time.time()

    async def publish_model(self, local: LocalModel) -> ModelCard:
        """Put tokenizer.json in the object store (if changed) and the card in the bucket."""
        s = self.cfg.subjects
        digest = hashlib.sha256(local.tokenizer_json).hexdigest()
        obj_name = f"{model_token(local.name)}/tokenizer-{digest[:16]}.json"
        store = await self.js.object_store(s.bucket_name(MODEL_FILES_STORE))
        try:
            await store.get_info(obj_name)
        except Exception:  # not there yet
            await store.put(obj_name, local.tokenizer_json)
        card = msgspec.structs.replace(
            to_model_card(local, obj_name, self.engine.tasks),
            kv_branch_blocks=self.cfg.kv_branch_blocks,
        )
        models = await self.js.key_value(s.bucket_name(MODELS_BUCKET))
        await models.put(model_token(local.name), encode(card))
        return card

    def registration(self) -> WorkerRegistration:
        c, e = self.cfg, self.engine
        return WorkerRegistration(
            worker_id=c.worker_id,
            model=c.model_name,
            role=c.role,
            engine=c.engine,
            max_num_seqs=e.max_num_seqs,
            num_gpu_blocks=e.num_gpu_blocks,
            block_size=e.block_size,
            kv_branch_blocks=c.kv_branch_blocks,
            status=self.status,
            heartbeat_at_s=time.time(),
            heartbeat_interval_s=c.heartbeat_interval_s,
            ttl_s=c.ttl_s,
            started_at_s=self._started_at,
            host=socket.gethostname(),
            pid=c.pid,
            metrics_url=self.metrics_url,
            managed_by=c.managed_by,
            loras=self.engine.lora_names(),
            structured=e.structured,
        )

    async def register(self) -> None:
        s = self.cfg.subjects
        self._kv = await self.js.key_value(s.bucket_name(WORKERS_BUCKET))
        self._beats = await self.js.key_value(s.bucket_name(HEARTBEATS_BUCKET))
        reg = encode(self.registration())
        await self._beats.put(self.cfg.worker_id, reg)  # first: a judge finds it alive
        await self._kv.put(self.cfg.worker_id, reg)
        self._task = asyncio.create_task(self._heartbeat(), name="heartbeat")

    async def _heartbeat(self) -> None:
        # Also ends on ``_beating``: on Python 3.11 a cancel that lands as a put's reply arrives
        # is swallowed by ``asyncio.wait_for`` inside nats-py, and the loop would beat on (and
        # ``deregister`` wait for it) forever: seen on 31 of 1,024 workers draining at once.
        # the first refresh at a random time: workers started together refresh apart
        refreshed = time.monotonic() - random.uniform(0, REGISTRATION_REFRESH_S)
        beat_subject = self.cfg.subjects.bucket_key(HEARTBEATS_BUCKET, self.cfg.worker_id)
        while self._beating:
            await asyncio.sleep(self.cfg.heartbeat_interval_s)
            if not self._beating:
                return
            try:
                reg = encode(self.registration())
                if self.nc is not None:
                    await self.nc.publish(beat_subject, reg)
                else:
                    await self._beats.put(self.cfg.worker_id, reg)
                if time.monotonic() - refreshed >= REGISTRATION_REFRESH_S:
                    # also brings back a registration a judge deleted while the worker was cut
                    # off (its heartbeats did not arrive) and that it outlived
                    await self._kv.put(self.cfg.worker_id, reg)
                    refreshed = time.monotonic()
            except Exception as exc:  # NATS reconnecting: next beat retries
                log.warning("heartbeat_failed", worker_id=self.cfg.worker_id, error=str(exc))

    async def set_status(self, status: WorkerStatus) -> None:
        self.status = status
        await self.publish()

    async def publish(self) -> None:
        """The registration now (its status or adapters changed)."""
        if self._kv is not None:
            reg = encode(self.registration())
            with contextlib.suppress(Exception):
                await self._beats.put(self.cfg.worker_id, reg)
                await self._kv.put(self.cfg.worker_id, reg)

    async def deregister(self) -> None:
        self._beating = False
        if self._task is not None:
            await cancel_and_wait([self._task])
        if self._kv is not None:
            with contextlib.suppress(Exception):
                await self._kv.delete(self.cfg.worker_id)
            with contextlib.suppress(Exception):
                await self._beats.delete(self.cfg.worker_id)

    def request_stop(self) -> None:
        self.stop_requested.set()

    def load_report(self, load: EngineLoad) -> WorkerLoad:
        c = self.cfg
        hit_rate = (
            load.cached_tokens_total / load.prompt_tokens_total if load.prompt_tokens_total else 0.0
        )
        return WorkerLoad(
            worker_id=c.worker_id,
            model=c.model_name,
            role=c.role,
            ts_s=time.time(),
            num_running=load.num_running,
            num_waiting=load.num_waiting,
            max_num_seqs=load.max_num_seqs,
            kv_usage=load.kv_usage,
            num_gpu_blocks=load.num_gpu_blocks,
            active_decode_blocks=load.active_decode_blocks,
            active_prefill_tokens=load.active_prefill_tokens,
            num_preempted_total=load.num_preempted_total,
            prefix_cache_hit_rate=hit_rate,
            step_ms=load.step_ms,
            status=self.status,
            num_cpu_blocks=load.num_cpu_blocks,
            host_kv_usage=load.num_host_blocks / max(load.num_cpu_blocks, 1),
            steps_total=load.steps_total,
        )
