"""The fleet's index follows vLLM's prefix cache: vLLM's KV events on their way to the worker.

- **Events.** vLLM publishes its own events on a ZMQ socket; the follower's subscriber
  (``subscriber.py``, started with the follower, before vLLM binds) reads them and fills gaps
  from vLLM's replay socket, ``kv_events.py`` decodes them. They pass through ``CacheShadow``
  (``cache_shadow.py``) on their way to the worker's KV listener. The engine starts the
  follower, has it serve once vLLM is up, and stops it: one object for the whole path.
- **Resync** (control op ``kv_resync``): the shadow is republished, one listener call per chunk
  of ``kv_resync_chunk_tokens`` so the worker publishes each as its own batch; live events wait
  until the last chunk is out.
- **Loss.** When events were lost for good, the fleet is told ``AllBlocksCleared`` and vLLM's
  prefix cache is reset (retried every ``kv_reset_retry_s`` while blocks are in use) so what
  vLLM holds and what the fleet sees meet again.
- **Emptied.** Whenever vLLM's cache is emptied (a confirmed reset, a sleep), the fleet is told
  ``AllBlocksCleared`` at once: vLLM itself only publishes its own at the next engine step,
  which an idle worker never takes. Before 0.12 ``reset_prefix_cache`` returns None whether or
  not it reset (it refuses while blocks are in use, with only a warning in its log): such a
  reset counts as done only when vLLM's own ``AllBlocksCleared`` arrives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import structlog

from base.cancelling import cancel_and_wait
from schemas.kv_events import AllBlocksCleared, KvCacheEvent
from workers.engine import KvListener
from workers.engines.vllm.cache_shadow import CacheShadow
from workers.engines.vllm.config import KvEventsEndpoints
from workers.engines.vllm.kv_events import BatchReader, DecodedBatch
from workers.engines.vllm.protocol import AsyncLlm
from workers.engines.vllm.subscriber import KvEventSubscriber
from workers.engines.vllm.versions import VllmFeatures

log = structlog.get_logger("jetfleet.vllm")


class KvFollower:
    """One vLLM engine's KV events -> the worker's listener (see the module docstring)."""

    def __init__(
        self,
        reader: BatchReader,
        busy: Callable[[], bool],
        reset_retry_s: float,
        resync_chunk_tokens: int,
    ) -> None:
        """``busy``: whether requests are running (vLLM before 0.12 would refuse a reset)."""
        self.shadow = CacheShadow()
        self._reader = reader
        self._busy = busy
        self._reset_retry_s = reset_retry_s
        self._resync_chunk_tokens = resync_chunk_tokens
        self._listener: KvListener | None = None  # the worker's, from start
        self._llm: AsyncLlm | None = None  # vLLM's AsyncLLM, while it serves
        self._features: VllmFeatures | None = None
        self._vllm_clears = 0  # AllBlocksCleared events vLLM itself published
        self._vllm_cleared = asyncio.Event()  # set by each of them
        self._held: list[KvCacheEvent] | None = None  # events arriving during a resync
        self._reset_task: asyncio.Task[None] | None = None
        self.subscriber: KvEventSubscriber | None = None  # while it follows vLLM's sockets

    async def start(
        self, listener: KvListener, endpoints: KvEventsEndpoints | None, replay_timeout_s: float
    ) -> None:
        """Events go to ``listener`` from now on: subscribed to ``endpoints`` before vLLM binds
        them, so none is missed (None: this worker publishes no KV events)."""
        self._listener = listener
        if endpoints is not None:
            self.subscriber = KvEventSubscriber(
                endpoints.connect_publish,
                endpoints.connect_replay,
                endpoints.topic,
                self,
                replay_timeout_s=replay_timeout_s,
            )
            await self.subscriber.start()

    def serve(self, llm: AsyncLlm, features: VllmFeatures) -> None:
        """vLLM is up: resets go to ``llm``."""
        self._llm, self._features = llm, features

    async def stop(self) -> None:
        self._llm = None
        task, self._reset_task = self._reset_task, None
        if task is not None:
            await cancel_and_wait([task])
        if self.subscriber is not None:
            await self.subscriber.close()
            self.subscriber = None

    @property
    def resetting(self) -> bool:
        """A reset after a loss is still unconfirmed."""
        return self._reset_task is not None and not self._reset_task.done()

    # ------------------------------------------------------------------ the subscriber's calls
    def decode(self, payload: bytes) -> DecodedBatch:
        batch = self._reader.decode(payload)
        if any(isinstance(e, AllBlocksCleared) for e in batch.events):
            self._vllm_clears += 1
            self._vllm_cleared.set()
        return batch

    def on_events(self, events: Sequence[KvCacheEvent]) -> None:
        forward = self.shadow.apply(events)
        if not forward or self._listener is None:
            return
        if self._held is not None:
            self._held.extend(forward)
        else:
            self._listener(forward)

    def on_lost(self, reason: str) -> None:
        log.warning("vllm_kv_events_lost", reason=reason)
        if self._reset_retry_s <= 0 or self._llm is None:
            return
        if self._reset_task is None or self._reset_task.done():
            self._reset_task = asyncio.create_task(self._reset_after_loss(), name="vllm-kv-reset")

    # ------------------------------------------------------------------ operations
    async def reset(self) -> bool | None:
        """``reset_prefix_cache``: True when vLLM reset (the fleet is told at once), False when
        it refused (blocks in use), None when this release does not say (before 0.12)."""
        says = self._features is not None and self._features.reset_returns_bool
        if not says and self._busy():
            return False  # it would refuse, and only log a warning
        if self._llm is None:
            raise RuntimeError("vLLM engine is not running")
        result = await self._llm.reset_prefix_cache()
        if not says:
            return None
        if result:
            self.emptied()
        return bool(result)

    def emptied(self) -> None:
        """vLLM's cache is empty now: the fleet forgets this worker's blocks without waiting for
        vLLM's own ``AllBlocksCleared`` (published at its next engine step)."""
        self.on_events([AllBlocksCleared()])

    async def resync(self) -> int:
        """Republish the whole cache (see the module docstring); the blocks republished."""
        assert self._listener is not None, "resync before start"
        chunks = list(self.shadow.snapshot_events(self._resync_chunk_tokens))
        self._held = []
        try:
            for chunk in chunks:
                self._listener(chunk)
                await asyncio.sleep(0)
        finally:
            held, self._held = self._held, None
            if held:
                self._listener(held)
        return len(self.shadow)

    async def _reset_after_loss(self) -> None:
        """Reset vLLM's prefix cache, retrying every ``reset_retry_s`` while blocks are in use,
        until the reset is known to have happened (see the module docstring)."""
        while self._llm is not None:
            seen = self._vllm_clears
            try:
                done = await self.reset()
            except Exception as exc:
                log.warning("vllm_prefix_cache_reset_failed", error=repr(exc))
                done = False
            if done is None:  # this vLLM does not say: wait for its AllBlocksCleared
                done = await self._vllm_clear_after(seen, self._reset_retry_s)
            if done:
                log.info("vllm_prefix_cache_reset_after_loss")
                return
            await asyncio.sleep(self._reset_retry_s)

    async def _vllm_clear_after(self, seen: int, timeout_s: float) -> bool:
        """True once vLLM has published an ``AllBlocksCleared`` beyond the first ``seen``."""
        try:
            async with asyncio.timeout(timeout_s):
                while self._vllm_clears <= seen:
                    self._vllm_cleared.clear()
                    await self._vllm_cleared.wait()
        except TimeoutError:
            return False
        return True
