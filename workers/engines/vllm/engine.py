"""The vLLM engine (``--engine vllm``): vLLM's V1 ``AsyncLLM`` behind the worker's ``Engine``.

- **Requests.** ``add_request`` maps our request to ``SamplingParams`` (``mapping.py``) and a
  ``TokensPrompt`` and starts one task that consumes ``AsyncLLM.generate()`` with
  ``RequestOutputKind.DELTA``: each ``RequestOutput`` carries only new token ids and goes to the
  sink as one ``EngineOutput`` (``num_cached_tokens`` from vLLM's prefix cache). vLLM's request id
  is ours plus a counter, so a newer attempt of a request can start while vLLM still tears the
  aborted one down. An exception from vLLM ends the request with ``finish_reason="error"`` and
  the message. ``abort`` cancels the task (vLLM aborts the request when its generator is
  cancelled; the task also calls ``AsyncLLM.abort``) and sends the final ``abort`` output at once.
- **KV events.** vLLM publishes its own events on a ZMQ socket (``subscriber.py`` reads them and
  fills gaps from vLLM's replay socket); ``KvFollower`` (``kv_follow.py``) takes them to the
  worker's KV listener through the cache shadow, republishes the shadow on ``kv_resync``, and
  resets vLLM's prefix cache after events were lost for good.
- **Death.** When vLLM's engine core dies (``EngineDeadError``: a crash, an engine process
  killed) every request fails inside vLLM and ``AsyncLLM.errored`` turns true; the adapter
  notices on the first failed request or within a second (a watcher), drops what it held without
  final outputs and tells the worker (``EngineHooks.failed``), which leaves the fleet at once so
  the frontends migrate those requests, and exits failed to be restarted. A worker whose engine
  died never stays registered as a black hole that fails whatever is routed to it.
- **Load.** ``load()`` combines the last scheduler stats (``stats.py``, a stat logger handed to
  ``AsyncLLM``) with the adapter's own counts: ``active_decode_blocks`` is vLLM's KV usage times
  its block count; ``active_prefill_tokens`` the prompt tokens of requests without a first
  token yet; the prompt/cached token totals are summed from the first output of each request.
- **Start.** ``AsyncLLM`` is built in a thread (loading weights and profiling take minutes and
  poll ZMQ synchronously): the event loop keeps answering NATS meanwhile, and the worker registers
  only once ``start`` returns. vLLM's own ``block_size`` is read back: a mismatch with the fleet's
  (vLLM overrides it for hybrid models or quantized KV) refuses to serve, since the router would
  hash prompts in blocks of the wrong size. ``vllm.__version__`` picks the release's behaviour
  from ``versions.py``.
- **Control.** health, sleep/wake, clear_kv, kv_resync and the LoRA ops: ``control.py``
  (``VllmControl``); requests admitted while asleep wait for the wake (``awake``).
- **The fleet's index follows vLLM's cache** (``kv_follow.py``): a confirmed reset or a sleep
  tells the fleet ``AllBlocksCleared`` at once; before 0.12 a reset is unconfirmed until vLLM's
  own ``AllBlocksCleared`` arrives, and ``clear_kv`` says so. Before 0.10.1 ``sleep`` keeps the
  prefix-cache entries of the discarded KV memory: the adapter resets the cache itself first.
- ``kv_transfer_params`` of a request go to vLLM in ``SamplingParams.extra_args``; the ones vLLM
  returns on a request's final output (a prefill for a remote decode) come back on the final
  ``EngineOutput``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import tempfile
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import structlog

from workers.engine import (
    ControlResult,
    EngineHooks,
    EngineLoad,
    EngineOutput,
    EngineRequest,
    OutputSink,
)
from workers.engines.vllm.backend import RealVllmBackend, VllmBackend
from workers.engines.vllm.config import VllmEngineConfig
from workers.engines.vllm.control import CPU_CANNOT_SLEEP, VllmControl
from workers.engines.vllm.cpu_list import format_cpu_list
from workers.engines.vllm.kv_events import BatchReader, DecodeOptions
from workers.engines.vllm.kv_follow import KvFollower
from workers.engines.vllm.lora import LoraRegistry
from workers.engines.vllm.mapping import finish_reason, logprobs_of, sampling_kwargs
from workers.engines.vllm.protocol import (
    AsyncLlm,
    PoolingRequestOutput,
    RequestOutput,
    VllmObject,
)
from workers.engines.vllm.stats import SchedulerStatsCollector
from workers.engines.vllm.versions import VllmFeatures, features

log = structlog.get_logger("jetfleet.vllm")

Out = TypeVar("Out")  # what an output stream of vLLM's yields


class VllmConfigMismatchError(RuntimeError):
    """vLLM settled on a configuration the fleet cannot route for (e.g. another block size)."""


@dataclass(eq=False, slots=True)
class _Running:
    request_id: str
    vllm_id: str
    sink: OutputSink
    num_prompt_tokens: int
    task: asyncio.Task[None] | None = None
    started: bool = False  # a first output came (the prompt is prefilled)
    logprobs: int | None = None  # asked per generated token (top k)
    prompt: tuple[int, ...] | None = None  # kept until vLLM returns its prompt logprobs
    prompt_logprobs: int = 0
    priority: int = 0  # the request's (vLLM's priority scheduling policy)


class VllmEngine:
    name = "vllm"
    kv_fleet_hashing = False  # vLLM's hashes are its own: the worker's relay translates them
    structured = "logits"  # guided decoding masks the logits

    def __init__(self, config: VllmEngineConfig, backend: VllmBackend | None = None) -> None:
        """Raises ``VllmNotInstalledError`` without a backend when vLLM is not installed."""
        self.config = config
        self.backend: VllmBackend = backend if backend is not None else RealVllmBackend()
        self.tasks = config.tasks
        self.max_num_seqs = config.max_num_seqs
        self.block_size = config.block_size
        self.num_gpu_blocks = 0  # known once started
        self.max_model_len: int | None = None  # known once started
        self.llm: AsyncLlm | None = None
        self.features: VllmFeatures | None = None  # known once started
        self.sleep_level = 0
        self.on_cpu = False  # known once started
        self._stats = SchedulerStatsCollector()
        self.loras = LoraRegistry()
        self.running: dict[str, _Running] = {}
        self.kv = KvFollower(
            BatchReader(
                self.backend.kv_event_batch_type(), DecodeOptions(lora_names=self.loras.names_by_id)
            ),
            lambda: bool(self.running),
            config.kv_reset_retry_s,
            config.kv_resync_chunk_tokens,
        )
        self._ids = itertools.count(1)
        self.awake = asyncio.Event()
        self.awake.set()
        self.hooks: EngineHooks | None = None  # given at start
        self._dead: str | None = None  # why vLLM's engine died (it serves nothing more)
        self._watch_task: asyncio.Task[None] | None = None
        self._workdir: Path | None = None
        self._pending_prefill_tokens = 0
        self._prompt_tokens_total = 0
        self._cached_tokens_total = 0
        self._control = VllmControl(self)

    # ------------------------------------------------------------------ lifecycle
    async def start(self, hooks: EngineHooks) -> None:
        self.hooks = hooks
        endpoints = None
        if self.config.kv_events:
            self._workdir = Path(tempfile.mkdtemp(prefix="jetfleet-vllm-"))
            endpoints = self.config.kv_endpoints(self._workdir)
        # subscribed before vLLM binds: no early event is missed
        await self.kv.start(hooks.kv_events, endpoints, self.config.kv_replay_timeout_s)
        try:
            started = await asyncio.to_thread(
                self.backend.start_llm, self.config, endpoints, self._stats
            )
        except BaseException:
            await self.stop()
            raise
        self.llm = started.llm
        try:
            self.features = features(started.version)
            if started.block_size != self.config.block_size:
                raise VllmConfigMismatchError(
                    f"vLLM {started.version} uses KV blocks of {started.block_size} tokens, the "
                    f"fleet hashes prompts in blocks of {self.config.block_size} (the model "
                    "card's block_size); set the model card's block_size to "
                    f"{started.block_size} or run a model vLLM can page in "
                    f"{self.config.block_size}-token blocks"
                )
            await self.llm.is_sleeping()  # on the loop: vLLM's output tasks start, it answers
        except BaseException:
            await self.stop()
            raise
        self.kv.serve(self.llm, self.features)
        self.num_gpu_blocks = started.num_gpu_blocks
        self.max_model_len = started.max_model_len
        self._watch_task = asyncio.create_task(self._watch_engine(), name="vllm-watch")
        self.on_cpu = started.on_cpu
        if started.on_cpu and self.config.enable_sleep_mode:
            log.warning("vllm_sleep_mode_unavailable", reason=CPU_CANNOT_SLEEP)
        log.info(
            "vllm_started",
            model=self.config.model,
            vllm=started.version,
            num_gpu_blocks=self.num_gpu_blocks,
            block_size=started.block_size,
            max_num_seqs=started.max_num_seqs,
            max_num_batched_tokens=started.max_num_batched_tokens,
            cpu_threads=os.environ.get("OMP_NUM_THREADS") if started.on_cpu else None,
            # the cores it runs on (pinned, or all this process may use), and vLLM's processes
            cpu_cores=format_cpu_list(sorted(os.sched_getaffinity(0))) if started.on_cpu else None,
        )

    async def stop(self) -> None:
        tasks = [r.task for r in self.running.values() if r.task is not None]
        self.running.clear()
        if self._watch_task is not None:
            tasks.append(self._watch_task)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.kv.stop()
        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    # ------------------------------------------------------------------ requests
    def add_request(self, request: EngineRequest, sink: OutputSink) -> None:
        if self._dead is not None:
            return  # the worker is leaving: its frontends migrate what it held
        rid = request.request_id
        if rid in self.running:  # a newer attempt replaces the running one
            self.abort(rid)
        try:
            if request.task not in self.tasks:
                raise ValueError(
                    f"this vLLM worker does not {request.task} (it serves {self.tasks})"
                )
            num_prompt = len(request.token_ids)
            if request.prompt_embeds is not None:
                if "prompt_embeds" not in self.tasks:
                    raise ValueError(
                        "this vLLM worker takes no prompt_embeds (start it with "
                        "--vllm-arg enable_prompt_embeds=true)"
                    )
                prompt, num_prompt = self.backend.embeds_prompt(request.prompt_embeds)
            else:
                prompt = self.backend.tokens_prompt(request.token_ids)
            lora = self._lora_request(request.lora_name)
            if request.task == "embed":
                params = self.backend.pooling_params(request.dimensions)
            else:
                new_names = self.features is None or self.features.structured_outputs
                params = self.backend.sampling_params(sampling_kwargs(request, new_names))
        except Exception as exc:  # vLLM validates sampling params: a bad request, not a crash
            sink.on_output(EngineOutput(rid, (), True, "error", error=str(exc)))
            return
        sp = request.sampling
        run = _Running(rid, f"{rid}-{next(self._ids)}", sink, num_prompt)
        run.logprobs = sp.logprobs
        run.priority = request.priority
        if sp.prompt_logprobs is not None:
            run.prompt, run.prompt_logprobs = tuple(request.token_ids), sp.prompt_logprobs
        self.running[rid] = run
        self._pending_prefill_tokens += run.num_prompt_tokens
        work = self._embed if request.task == "embed" else self._generate
        run.task = asyncio.create_task(work(run, prompt, params, lora), name=run.vllm_id)

    def _lora_request(self, name: str | None) -> VllmObject | None:
        if not name:
            return None
        loaded = self.loras.get(name)
        if loaded is None:
            raise ValueError(f"LoRA adapter {name!r} is not loaded on this worker")
        return self.backend.lora_request(loaded.name, loaded.lora_id, loaded.path)

    async def _generate(
        self, run: _Running, prompt: VllmObject, params: VllmObject, lora: VllmObject | None
    ) -> None:
        # vLLM refuses a priority unless it schedules by priority
        by_priority = self.config.scheduling_policy == "priority"
        extra = {"priority": run.priority} if by_priority and run.priority else {}

        def start(llm: AsyncLlm) -> AsyncGenerator[RequestOutput, None]:
            return llm.generate(
                prompt=prompt,
                sampling_params=params,
                request_id=run.vllm_id,
                lora_request=lora,
                **extra,
            )

        await self._drive(run, start, self._deliver)

    async def _embed(
        self, run: _Running, prompt: VllmObject, params: VllmObject, lora: VllmObject | None
    ) -> None:
        """``AsyncLLM.encode`` (same signature from 0.10 to 0.33): one pooled vector."""
        await self._drive(
            run,
            lambda llm: llm.encode(prompt, params, run.vllm_id, lora_request=lora),
            self._deliver_embedding,
        )

    async def _drive(
        self,
        run: _Running,
        start: Callable[[AsyncLlm], AsyncGenerator[Out, None]],
        deliver: Callable[[_Running, Out], bool],
    ) -> None:
        """Follow one of vLLM's output streams into ``deliver`` until it says the request
        finished; an early end, an exception or a cancellation ends the request cleanly."""
        try:
            await self.awake.wait()
            if self.llm is None:
                raise RuntimeError("vLLM engine is not running")
            outputs = start(self.llm)
            async with contextlib.aclosing(outputs):  # closing it makes vLLM abort the request
                async for out in outputs:
                    if self.running.get(run.request_id) is not run:
                        return  # aborted or replaced meanwhile
                    if deliver(run, out):
                        return
            self._finish(run, "error", "vLLM ended the output stream before the request finished")
        except asyncio.CancelledError:
            if self.llm is not None:
                with contextlib.suppress(Exception):
                    await self.llm.abort(run.vllm_id)
            raise
        except Exception as exc:
            if self.llm is not None and self.llm.errored:
                self._engine_died(f"{type(exc).__name__}: {exc}")
                return
            log.warning("vllm_request_failed", request_id=run.request_id, error=repr(exc))
            self._finish(run, "error", f"{type(exc).__name__}: {exc}")

    async def _watch_engine(self, period_s: float = 1.0) -> None:
        """An idle engine that dies fails no request: notice it anyway (``AsyncLLM.errored``)."""
        while self.llm is not None and self._dead is None:
            if self.llm.errored:
                self._engine_died("vLLM's engine core died")
                return
            await asyncio.sleep(period_s)

    def _engine_died(self, reason: str) -> None:
        """vLLM's engine is gone for good (``EngineDeadError``): nothing in flight gets a final
        output (the worker leaves the fleet and the frontends migrate those requests)."""
        if self._dead is not None:
            return
        self._dead = reason
        log.error("vllm_engine_dead", reason=reason, in_flight=len(self.running))
        runs = list(self.running.values())
        self.running.clear()
        for run in runs:
            if run.task is not None and run.task is not asyncio.current_task():
                run.task.cancel()
        if self.hooks is not None:
            self.hooks.failed(reason)

    def _deliver_embedding(self, run: _Running, out: PoolingRequestOutput) -> bool:
        """A ``PoolingRequestOutput``: the vector, on the finished one."""
        if not out.finished:
            return False
        del self.running[run.request_id]
        self._settle_prefill(run)
        data = out.outputs.data  # a tensor on vLLM's side: torch stays in vLLM
        vector = tuple(float(x) for x in (data.tolist() if hasattr(data, "tolist") else data))
        cached = int(getattr(out, "num_cached_tokens", 0) or 0)
        run.sink.on_output(
            EngineOutput(
                run.request_id,
                (),
                True,
                "stop",
                num_prompt_tokens=run.num_prompt_tokens,
                num_cached_tokens=cached,
                embedding=vector,
            )
        )
        return True

    def _deliver(self, run: _Running, out: RequestOutput) -> bool:
        """One ``RequestOutput`` (delta) to the sink; True when it finished the request."""
        completion = out.outputs[0] if out.outputs else None
        tokens = tuple(completion.token_ids) if completion is not None else ()
        cached = int(out.num_cached_tokens or 0)
        transfer: dict[str, object] | None = None
        if not run.started:
            self._settle_prefill(run)
            self._prompt_tokens_total += run.num_prompt_tokens
            self._cached_tokens_total += cached
        reason: str | None = None
        error: str | None = None
        if out.finished:
            del self.running[run.request_id]
            reason = finish_reason(completion.finish_reason if completion is not None else None)
            if reason == "error":
                error = "vLLM finished the request with an error"
            params = getattr(out, "kv_transfer_params", None)
            transfer = dict(params) if params else None
        logprobs = prompt_lps = None
        if run.logprobs is not None and completion is not None:
            found = logprobs_of(tokens, completion.logprobs or (), run.logprobs)
            logprobs = tuple(lp for lp in found if lp is not None)
        given = getattr(out, "prompt_logprobs", None)  # not in every release's outputs
        if run.prompt is not None and given:
            prompt_lps = logprobs_of(run.prompt, given, run.prompt_logprobs)
            run.prompt = None
        run.sink.on_output(
            EngineOutput(
                run.request_id,
                tokens,
                finished=bool(out.finished),
                finish_reason=reason,
                num_prompt_tokens=run.num_prompt_tokens,
                num_cached_tokens=cached,
                error=error,
                kv_transfer_params=transfer,
                logprobs=logprobs,
                prompt_logprobs=prompt_lps,
            )
        )
        return bool(out.finished)

    def _finish(self, run: _Running, reason: str, error: str | None = None) -> None:
        if self.running.get(run.request_id) is not run:
            return
        del self.running[run.request_id]
        self._settle_prefill(run)
        run.sink.on_output(
            EngineOutput(
                run.request_id,
                (),
                True,
                reason,
                num_prompt_tokens=run.num_prompt_tokens,
                error=error,
            )
        )

    def _settle_prefill(self, run: _Running) -> None:
        if not run.started:
            run.started = True
            self._pending_prefill_tokens -= run.num_prompt_tokens

    def abort(self, request_id: str) -> bool:
        run = self.running.pop(request_id, None)
        if run is None:
            return False
        self._settle_prefill(run)
        if run.task is not None:
            run.task.cancel()
        run.sink.on_output(
            EngineOutput(request_id, (), True, "abort", num_prompt_tokens=run.num_prompt_tokens)
        )
        return True

    # ------------------------------------------------------------------ load
    def load(self) -> EngineLoad:
        s = self._stats.snapshot()
        in_flight = len(self.running)
        running = min(s.num_running, in_flight)
        return EngineLoad(
            num_running=running,
            num_waiting=max(s.num_waiting if in_flight else 0, in_flight - running),
            max_num_seqs=self.max_num_seqs,
            kv_usage=s.kv_usage,
            num_gpu_blocks=self.num_gpu_blocks,
            block_size=self.block_size,
            active_decode_blocks=round(s.kv_usage * self.num_gpu_blocks),
            active_prefill_tokens=self._pending_prefill_tokens,
            num_preempted_total=s.num_preempted_total,
            prompt_tokens_total=self._prompt_tokens_total,
            cached_tokens_total=self._cached_tokens_total,
            step_ms=s.step_ms if in_flight else 0.0,
            steps_total=s.records,  # vLLM records its stats once a step
        )

    def lora_names(self) -> tuple[str, ...]:
        return tuple(lora.name for lora in self.loras.loaded())

    # ------------------------------------------------------------------ control
    async def control(self, op: str, args: dict[str, str]) -> ControlResult:
        return await self._control.run(op, args)
