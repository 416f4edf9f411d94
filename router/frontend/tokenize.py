"""Chat templates and tokenizing off the event loop, in parallel, through the prefix cache.

HF ``tokenizers``' ``encode`` holds the GIL for its whole run (a long prompt stops everything else
in the process), while ``encode_batch`` releases it (measured: docs/benchmarks.md, "Measurements
behind design choices"). So prompts are queued and tokenized with ``encode_batch`` on worker
threads, one thread per core; the event loop keeps streaming meanwhile. Two lanes, each with its own
threads: small requests (body below ``short_bytes``) never wait behind long prompts. The short lane
takes all that waits as one batch (many small prompts: the hand-off costs more than they do). The
long lane gives each free thread one prompt, the shortest waiting first: a batch returns when its
last prompt is done, so long prompts arriving together in one batch would each wait for all of them.
Shortest first, but waiting ages a prompt (``overtake_bytes_per_s``): the largest prompt of a burst
is passed over only for as long as shorter ones take, at most its size at that rate (a 1 MB prompt:
60 ms). Pure shortest-first put a trace's 80k+-token prompts last in every burst, 5% on their TTFT,
which is the tail (docs/benchmarks.md, "Later slices and the synthetic trace").

A prompt of at least twice ``split_chars`` characters is cut into pieces, one a thread, and
tokenized in one ``encode_batch`` on as many cores (``model/split_encode.py``: cuts only where a
cut changes no token, checked per tokenizer): a lone 120k-token prompt took 361 ms of one core and
takes 159 ms on two, and that wait is in its first token. Only the longest prompts are cut: a cut
prompt takes every core, and the prompts beside it wait (cutting from 64 kB on made a trace's
prompts below 4k tokens 25% slower to their first token, docs/benchmarks.md).

Each served model gets a ``SegmentCache`` (``model/prompt_cache.py``): a conversation that
extends an earlier one is tokenized only past what it shares with it. The cache is checked
against fresh tokenizing on probe conversations when the model is first used; a tokenizer that
fails the check is served without it (logged).

A prompt far longer than the context is refused after tokenizing only a prefix long enough to
prove it (``context + 1`` tokens of at most ``_MAX_CHARS_PER_TOKEN`` characters). Only a text
longer than ``_PROBE_CHARS_PER_TOKEN`` characters a context token is probed so: a prompt near the
context (a 120k-word prompt on a 128k model is ~1 MB) is tokenized once, not probed and then
tokenized again (the probe was most of a second copy: +250 ms TTFT at 120k tokens), and one
a little too long gets the exact count in its error.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram

from base.cancelling import cancel_and_wait
from model.prompt_cache import CacheStats, EncodeBatch, SegmentCache, verify
from model.split_encode import SplitEncoder, verify_split
from model.tokenizer import ModelTokenizer

log = structlog.get_logger("jetfleet.frontend")

_MAX_CHARS_PER_TOKEN = 8  # a prefix this many chars per token proves "too long" cheaply
_PROBE_CHARS_PER_TOKEN = 16  # probe only texts longer than this many chars per context token
_PROBE = [
    "You are a helpful assistant. Réponds en français — naïve café.",
    "Summarise this:  the   quick brown fox\n\njumps over 12,345 lazy dogs; 日本語のテキスト 🎉",
    "Sure! Here it is:\n```python\nprint('hi')\n```",
    "again, with   spaces and\ttabs, and an unfinished wor",
]


class PromptTooLong(ValueError):
    """The prompt holds more than ``at_least`` tokens, more than the context allows."""

    def __init__(self, at_least: int) -> None:
        super().__init__(f"at least {at_least} tokens")
        self.at_least = at_least


@dataclass(frozen=True)
class TokenizeConfig:
    cache_tokens: int = 4_000_000
    """Prompt tokens the prefix cache keeps per model, 4 bytes each (0: no cache)."""
    short_bytes: int = 16384
    """Requests with a smaller body use the short lane (never queued behind long prompts)."""
    inline_bytes: int = 8192
    """An idle frontend tokenizes requests with a smaller body on the event loop."""
    overtake_bytes_per_s: float = 16e6
    """Long lane: each second a prompt waits counts as this many bytes fewer in its rank (0: the
    shortest always first; very large: first come, first served)."""
    threads: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))
    """Batches tokenized at once per lane (default: the cores this process may use)."""
    split_chars: int = 196608
    """A prompt of at least twice this many characters (~0.1 s of a core to tokenize) is cut
    into pieces of at least this many, one a core at most, tokenized on as many cores at once
    (0: never). Lower, more prompts take every core and the shorter ones wait behind them."""


class TokenizeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        ns = "jetfleet_frontend_tokenizer"
        self.seconds = Histogram(
            f"{ns}_seconds",
            "Queue wait + template + tokenizing per prompt",
            ["lane"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=registry,
        )
        self.batch = Histogram(
            f"{ns}_batch_prompts",
            "Prompts tokenized in one encode_batch",
            ["lane"],
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=registry,
        )
        self.cache_segments = Counter(
            f"{ns}_cache_segments",
            "Prompt segments served from the prefix cache (hit) or tokenized (miss)",
            ["model", "result"],
            registry=registry,
        )
        self.cached_tokens = Counter(
            f"{ns}_cached_tokens", "Prompt tokens not tokenized again", ["model"], registry=registry
        )
        self.split_prompts = Counter(
            f"{ns}_split_prompts",
            "Long prompts tokenized in pieces on several cores",
            ["model"],
            registry=registry,
        )
        self.tokens = Counter(
            f"{ns}_tokens", "Prompt tokens produced", ["model"], registry=registry
        )


@dataclass
class _Job:
    model: str
    tokenizer: ModelTokenizer
    render: Callable[[], str]  # the prompt text (renders the chat template, may raise)
    context_length: int
    future: asyncio.Future[list[int]]
    size: int = 0  # the request body's bytes: the long lane takes the smallest first
    queued_at: float = field(default_factory=time.monotonic)


class _ModelCache:
    def __init__(self, cache: SegmentCache | None, encode: EncodeBatch) -> None:
        self.cache = cache
        self.encode = encode  # the tokenizer's encode_batch, or a SplitEncoder over it
        self.seen = CacheStats()
        self.split_seen = 0  # the SplitEncoder's count already in the metric


class PromptTokenizer:
    def __init__(self, cfg: TokenizeConfig, metrics: TokenizeMetrics) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self._lanes: dict[str, asyncio.PriorityQueue[tuple[float, int, _Job]]] = {}
        self._order = itertools.count()  # FIFO among equal sizes
        self._pools: dict[str, ThreadPoolExecutor] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._caches: weakref.WeakKeyDictionary[ModelTokenizer, _ModelCache] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        self._pending = 0  # prompts queued or being tokenized on a thread

    def start(self) -> None:
        for lane in ("short", "long"):
            self._lanes[lane] = asyncio.PriorityQueue()
            self._pools[lane] = ThreadPoolExecutor(
                self.cfg.threads, thread_name_prefix=f"tokenize-{lane}"
            )
            self._tasks.append(asyncio.create_task(self._dispatch(lane), name=f"tokenize-{lane}"))

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)

    async def tokenize(
        self,
        model: str,
        tokenizer: ModelTokenizer,
        render: Callable[[], str],
        context_length: int,
        size_hint: int,
        idle: bool = False,
    ) -> list[int]:
        """Token ids of the prompt ``render`` gives (run on a tokenizer thread). Raises what
        ``render`` raises, or ``PromptTooLong``.

        ``idle``: the caller has nothing else in flight. A small prompt is then tokenized right
        here, on the event loop (nothing waits for the loop, and the hand-off to a thread and
        back costs more than the tokenizing)."""
        if not self._tasks:
            self.start()
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        job = _Job(model, tokenizer, render, context_length, future, size_hint)
        if idle and size_hint < self.cfg.inline_bytes and self._pending == 0:
            self._settle([job], *self._work([job]))
            self.metrics.seconds.labels("inline").observe(time.monotonic() - job.queued_at)
            return job.future.result()
        lane = "short" if size_hint < self.cfg.short_bytes else "long"
        # the short lane is FIFO (one batch takes all that waits); the long lane smallest first,
        # aged: a rank of size - rate * waited orders jobs as size + rate * queued_at does
        rank = 0.0 if lane == "short" else size_hint + self.cfg.overtake_bytes_per_s * job.queued_at
        self._lanes[lane].put_nowait((rank, next(self._order), job))
        self._pending += 1
        try:
            return await future
        finally:
            self._pending -= 1
            self.metrics.seconds.labels(lane).observe(time.monotonic() - job.queued_at)

    async def _dispatch(self, lane: str) -> None:
        """Start work as soon as a thread is free: on the short lane a batch of all that waits,
        on the long lane the shortest prompt waiting (see the module docstring)."""
        queue = self._lanes[lane]
        batch_max = 64 if lane == "short" else 1
        free = asyncio.Semaphore(self.cfg.threads)
        running: set[asyncio.Task[None]] = set()
        while True:
            await free.acquire()
            jobs = [(await queue.get())[2]]
            while not queue.empty() and len(jobs) < batch_max:
                jobs.append(queue.get_nowait()[2])
            jobs = [j for j in jobs if not j.future.done()]  # the client went away
            if not jobs:
                free.release()
                continue
            task = asyncio.create_task(self._run_batch(lane, jobs))
            running.add(task)

            def done(t: asyncio.Task[None]) -> None:
                running.discard(t)
                free.release()

            task.add_done_callback(done)

    async def _run_batch(self, lane: str, jobs: list[_Job]) -> None:
        loop = asyncio.get_running_loop()
        self.metrics.batch.labels(lane).observe(len(jobs))
        caches: list[_ModelCache] = []
        try:
            results, caches = await loop.run_in_executor(self._pools[lane], self._work, jobs)
        except Exception as exc:  # a tokenizer bug: fail this batch, keep the lane
            log.error("tokenize_failed", lane=lane, error=repr(exc))
            results = [exc] * len(jobs)
        self._settle(jobs, results, caches)

    def _settle(self, jobs: list[_Job], results: list[Any], caches: list[_ModelCache]) -> None:
        """Hand each job its tokens or its error; count tokens and cache use."""
        for job, result in zip(jobs, results, strict=True):
            if job.future.done():
                continue
            if isinstance(result, BaseException):
                job.future.set_exception(result)
            else:
                job.future.set_result(result)
                self.metrics.tokens.labels(job.model).inc(len(result))
        for job, mc in zip(jobs, caches, strict=False):
            self._count(job.model, mc)

    def _cache_for(self, tokenizer: ModelTokenizer) -> _ModelCache:
        """On a lane's thread: the model's cache, made and checked on first use."""
        with self._lock:
            mc = self._caches.get(tokenizer)
            if mc is not None:
                return mc
            mc = _ModelCache(None, self._encoder(tokenizer))
            if self.cfg.cache_tokens > 0 and tokenizer.special_tokens:
                cache = SegmentCache(tokenizer.special_tokens, self.cfg.cache_tokens)
                mc.cache = cache if self._verified(tokenizer, cache) else None
            self._caches[tokenizer] = mc
            return mc

    def _encoder(self, tokenizer: ModelTokenizer) -> EncodeBatch:
        """The model's ``encode_batch``: one that cuts a long prompt into pieces tokenized on
        several cores where the cut is checked to change no token (``model/split_encode.py``)."""
        if self.cfg.split_chars <= 0 or self.cfg.threads < 2:
            return tokenizer.encode_batch
        if not tokenizer.added_tokens_bare or tokenizer.tokens_span_spaces():
            return tokenizer.encode_batch  # a cut could fall inside a token
        glue = next(iter(tokenizer.special_tokens.items()), None)
        probes = [*_PROBE, " ".join(_PROBE)]
        if not verify_split(tokenizer.encode_batch, glue, probes):
            log.warning("split_tokenizing_disabled", reason="tokenizing in pieces differs")
            return tokenizer.encode_batch
        return SplitEncoder(tokenizer.encode_batch, self.cfg.threads, self.cfg.split_chars, glue)

    def _verified(self, tokenizer: ModelTokenizer, cache: SegmentCache) -> bool:
        probes: list[str] = []
        names = list(tokenizer.special_tokens)
        probes.append("".join(f"{names[i % len(names)]}{t}" for i, t in enumerate(_PROBE)))
        if tokenizer.has_chat_template:
            roles = ["system", "user", "assistant", "user"]
            msgs = [{"role": r, "content": c} for r, c in zip(roles, _PROBE, strict=True)]
            with contextlib.suppress(ValueError):  # a template may refuse this shape: skip it
                probes.append(tokenizer.apply_chat_template(msgs, add_generation_prompt=True))
        ok = verify(cache, tokenizer.encode_batch, probes)
        if not ok:
            log.warning("prompt_cache_disabled", reason="segmented tokenizing differs")
        return ok

    def _count(self, model: str, mc: _ModelCache) -> None:
        if isinstance(mc.encode, SplitEncoder):
            split = mc.encode.split_texts
            self.metrics.split_prompts.labels(model).inc(split - mc.split_seen)
            mc.split_seen = split
        if mc.cache is None:
            return
        now, seen = mc.cache.stats, mc.seen
        self.metrics.cache_segments.labels(model, "hit").inc(now.hits - seen.hits)
        self.metrics.cache_segments.labels(model, "miss").inc(now.misses - seen.misses)
        self.metrics.cached_tokens.labels(model).inc(now.cached_tokens - seen.cached_tokens)
        mc.seen = CacheStats(now.hits, now.misses, now.cached_tokens, now.fallbacks)

    def _work(self, jobs: list[_Job]) -> tuple[list[Any], list[_ModelCache]]:
        """On the lane's thread: render, refuse the far too long, tokenize the rest in batches
        (one per tokenizer)."""
        caches = [self._cache_for(j.tokenizer) for j in jobs]
        out: list[Any] = [None] * len(jobs)
        texts: dict[int, str] = {}
        for i, job in enumerate(jobs):
            try:
                text = job.render()
                self._check_length(job, text)
                texts[i] = text
            except Exception as exc:
                out[i] = exc
        by_tokenizer: dict[int, list[int]] = {}
        for i in texts:
            by_tokenizer.setdefault(id(jobs[i].tokenizer), []).append(i)
        for idx in by_tokenizer.values():
            mc = caches[idx[0]]
            batch = [texts[i] for i in idx]
            ids = mc.cache.encode(batch, mc.encode) if mc.cache is not None else mc.encode(batch)
            for i, tokens in zip(idx, ids, strict=True):
                out[i] = tokens
        return out, caches

    @staticmethod
    def _check_length(job: _Job, text: str) -> None:
        if len(text) <= (job.context_length + 1) * _PROBE_CHARS_PER_TOKEN:
            return  # tokenized once; the caller checks the count
        cut = (job.context_length + 1) * _MAX_CHARS_PER_TOKEN
        head = job.tokenizer.encode_batch([text[:cut]])[0]
        if len(head) > job.context_length + 16:  # a cut mid-word changes a few tokens at most
            raise PromptTooLong(len(head) - 16)
