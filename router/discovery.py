"""Discovery watcher: keeps a router's ``FleetState`` and model table in step with NATS.

- ``fleet_workers`` bucket (``FleetFollower``): registrations in, deletions out (a judge deletes a
  worker whose heartbeats stopped; with no judge about, the follower judges the heartbeats
  itself); each departure leaves the ``FleetState``, which tells the clients (their requests there
  migrate);
- ``fleet_models`` bucket (watched) + ``fleet_model_files`` object store: model cards and their
  tokenizers, loaded once per tokenizer digest;
- fleet.metrics.> (core subscription; the stream also keeps them): ``WorkerLoad`` reports;
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from base.cancelling import cancel_and_wait
from base.worker_follow import FleetFollower
from model.tokenizer import ModelTokenizer
from router.fleet_state import FleetState
from schemas import ModelCard, WireDecodeError, WorkerLoad, decode
from schemas.streams import MODEL_FILES_STORE, MODELS_BUCKET
from schemas.subjects import Subjects

log = structlog.get_logger("jetfleet.discovery")

# Reading a model's tokenizer from the object store: nats-py's ``ObjectStore.get`` waits for its
# chunks without a deadline (and keeps its consumer when cancelled), and a worker that re-puts the
# same object (several start at once and each finds it absent) purges the chunks another reader
# is waiting for. So the chunks are read here with a deadline, the consumer is always removed, the
# bytes are checked against the card's digest, and a failed read is tried again: the object is
# there, under a new set of chunks.
TOKENIZER_READ_TIMEOUT_S = 10.0
TOKENIZER_READ_ATTEMPTS = 6


@dataclass(frozen=True)
class ServedModel:
    card: ModelCard
    tokenizer: ModelTokenizer
    _texts: dict[int, str] = field(default_factory=dict, compare=False, repr=False)

    def token_text(self, token_id: int) -> str:
        """One token's text, special tokens included (logprobs name tokens by it); cached."""
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self.tokenizer.decode([token_id], False)
        return text


class Discovery:
    def __init__(
        self,
        nc: NATS,
        subjects: Subjects,
        state: FleetState,
        prune_interval_s: float = 0.25,
        on_worker_joined: Callable[[str], None] = lambda _w: None,
        tokenizer_read_timeout_s: float = TOKENIZER_READ_TIMEOUT_S,
        on_worker_left: Callable[[str], None] = lambda _w: None,
    ) -> None:
        """``on_worker_joined`` / ``on_worker_left``: told each worker id that joins or leaves
        (after the ``FleetState`` is)."""
        self.nc = nc
        self.js = nc.jetstream()
        self.subjects = subjects
        self.state = state
        self.models: dict[str, ServedModel] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self._models_watch: Any = None
        self._sub: Subscription | None = None
        self.synced = asyncio.Event()
        self._on_worker_left = on_worker_left
        self.watch = FleetFollower(
            nc,
            subjects,
            on_heard=state.upsert,
            on_gone=self._worker_gone,
            on_joined=on_worker_joined,
            expire_every_s=prune_interval_s,
        )
        self.tokenizer_read_timeout_s = tokenizer_read_timeout_s

    def _worker_gone(self, worker_id: str) -> None:
        self.state.remove(worker_id)
        self._on_worker_left(worker_id)

    async def start(self) -> None:
        s = self.subjects
        await self.watch.start()  # first: when it fails, nothing else is left running
        models = await self.js.key_value(s.bucket_name(MODELS_BUCKET))
        self._files = await self.js.object_store(s.bucket_name(MODEL_FILES_STORE))
        m_watch = await models.watchall()
        self._models_watch = m_watch
        self._sub = await self.nc.subscribe(s.metrics_all(), cb=self._on_load)
        model_sync = asyncio.Event()
        self._tasks = [asyncio.create_task(self._watch_models(m_watch, model_sync))]
        await model_sync.wait()
        self.synced.set()

    async def stop(self) -> None:
        await self.watch.stop()
        await cancel_and_wait(self._tasks)
        if self._models_watch is not None:
            with contextlib.suppress(Exception):
                await self._models_watch.stop()
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def _watch_models(self, watcher: Any, synced: asyncio.Event) -> None:
        async for entry in watcher:
            if entry is None:
                synced.set()
                continue
            if entry.operation in ("DEL", "PURGE") or not entry.value:
                continue
            try:
                card = decode(entry.value, ModelCard)
                await self._load_model(card)
            except Exception as exc:  # a bad card must not stop discovery
                log.warning("bad_model_card", key=entry.key, error=str(exc))

    async def _load_model(self, card: ModelCard) -> None:
        known = self.models.get(card.name)
        if known is not None and known.card.tokenizer_sha256 == card.tokenizer_sha256:
            self.models[card.name] = ServedModel(card, known.tokenizer)
            return
        data = await self._read_tokenizer(card)
        tok = ModelTokenizer(data, card.chat_template, card.bos_token, card.eos_token)
        self.models[card.name] = ServedModel(card, tok)
        log.info("model_loaded", model=card.name, context_length=card.context_length)

    async def _read_tokenizer(self, card: ModelCard) -> bytes:
        for attempt in range(1, TOKENIZER_READ_ATTEMPTS + 1):
            try:
                return await asyncio.wait_for(
                    self._read_object(card), self.tokenizer_read_timeout_s
                )
            except Exception as exc:  # a deadline, chunks purged under the read, a bad digest
                log.warning(
                    "model_tokenizer_retry",
                    model=card.name,
                    attempt=attempt,
                    error=str(exc) or type(exc).__name__,
                )
                if attempt < TOKENIZER_READ_ATTEMPTS:
                    await asyncio.sleep(min(0.2 * 2**attempt, 5.0))
        log.error("model_unavailable", model=card.name, object=card.tokenizer_object)
        raise ValueError(f"the tokenizer of {card.name} could not be read from the model store")

    async def _read_object(self, card: ModelCard) -> bytes:
        info = await self._files.get_info(card.tokenizer_object)
        if not info.nuid or not info.size:
            raise ValueError(f"the tokenizer of {card.name} is empty in the model store")
        bucket = self.subjects.bucket_name(MODEL_FILES_STORE)
        sub = await self.js.subscribe(f"$O.{bucket}.C.{info.nuid}", ordered_consumer=True)
        data = bytearray()
        try:
            while len(data) < info.size:
                data += (await sub.next_msg(timeout=self.tokenizer_read_timeout_s)).data
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if hashlib.sha256(data).hexdigest() != card.tokenizer_sha256:
            raise ValueError(f"the tokenizer of {card.name} does not match its card's digest")
        return bytes(data)

    async def _on_load(self, msg: Msg) -> None:
        try:
            load = decode(msg.data, WorkerLoad)
        except WireDecodeError:
            return  # observations share the stream but not this subject; others are noise
        self.state.apply_load(load, time.monotonic())
