"""The mocker engine: the pure scheduler driven in simulated time by one asyncio task.

Each iteration runs ``Scheduler.step()``, sleeps until the step's simulated duration
(``simulated_ms / speedup``) has passed since the step began, then hands the outputs to the
request sinks and pushes the block pool's KV events to the listener: as on a GPU, a step's tokens
and cached blocks exist when its forward pass ends (so a request's TTFT includes its own prefill,
and NVIDIA Dynamo's mocker publishes outputs at pass end too). Deadlines are kept on an absolute
clock so rounding of short sleeps does not accumulate. With a very high speedup the loop yields
to the event loop once per step and the fleet's own overhead is what remains.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
import xxhash

from base.cancelling import cancel_and_wait
from model.structured import Unsatisfiable, render
from schemas.requests import StructuredOutput
from schemas.tokens import TokenLogprob
from workers.engine import (
    ControlResult,
    EngineHooks,
    EngineLoad,
    EngineOutput,
    EngineRequest,
    OutputSink,
)
from workers.engines.mocker.config import MockerConfig
from workers.engines.mocker.embedding import embedding
from workers.engines.mocker.logprobs import prompt_logprobs, token_logprob
from workers.engines.mocker.scheduler import Scheduler, SeqOutput, SeqRequest

log = structlog.get_logger("jetfleet.mocker")


def vocabulary_token_source(vocab: tuple[int, ...]):  # type: ignore[no-untyped-def]
    """Deterministic ``(seed, position) -> token`` drawing from ``vocab`` (text-safe ids)."""
    if not vocab:
        raise ValueError("empty vocabulary")
    n = len(vocab)
    digest = xxhash.xxh3_64_intdigest

    def source(seed: int, position: int) -> int:
        return vocab[digest(position.to_bytes(8, "little"), seed & 0xFFFFFFFFFFFFFFFF) % n]

    return source


def request_seed(request_id: str, seed: int | None) -> int:
    """The client's seed, or one derived from the request id (stable across migrations)."""
    if seed is not None:
        return seed & 0xFFFFFFFFFFFFFFFF
    return xxhash.xxh3_64_intdigest(request_id.rsplit(":", 1)[0].encode())


@dataclass(frozen=True, slots=True)
class _Logprobs:
    """What a request that asked for logprobs needs at each output."""

    seed: int
    first_position: int
    k: int | None  # per generated token (None: not asked)
    prompt: tuple[int, ...] | None  # the prompt, when prompt logprobs were asked
    prompt_k: int


class MockerEngine:
    name = "mocker"
    kv_fleet_hashing = True  # its block pool hashes with schemas.hashing
    structured = "instances"  # no logits: it writes an instance (model.structured)
    tasks: tuple[str, ...] = ("generate", "embed")

    def __init__(
        self,
        config: MockerConfig,
        vocab: tuple[int, ...],
        encode: Callable[[str], list[int]] | None = None,
        hidden_size: int = 0,
        engine_id: str = "",
    ) -> None:
        """``encode``: the model's tokenizer, for structured output (the text is generated as
        the tokens of a schema instance); without it structured requests fail. ``hidden_size``:
        the length of its embeddings (0: the model's config does not say; 1024 then)."""
        self.config = config
        self.max_num_seqs = config.max_num_seqs
        self.num_gpu_blocks = config.num_gpu_blocks
        self.block_size = config.block_size
        self.max_model_len: int | None = None  # the model card's context length
        self._source = vocabulary_token_source(vocab)
        self._scheduler = Scheduler(config, self._source)
        self._encode = encode
        self._logprobs: dict[str, _Logprobs] = {}
        self.hidden_size = hidden_size or 1024
        self._embeds: dict[str, tuple[tuple[int, ...], int | None]] = {}
        # Disaggregation: this worker's id in the transfer parameters it returns; the prefill
        # side of each remote decode in flight here (to tell it the KV was pulled); the
        # transfer time of each landed transfer until its first output; the hold timers.
        self.engine_id = engine_id
        self._remote: dict[str, tuple[str, str]] = {}
        self._transfer_ms: dict[str, float] = {}
        self._hold_timers: dict[str, asyncio.TimerHandle] = {}
        self._holding: set[str] = set()  # prefills for remote decodes still running
        self._sinks: dict[str, OutputSink] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._hooks = EngineHooks(lambda _events: None)  # given at start
        self._last_step_ms = 0.0
        self._steps = 0
        # prompt tokens of the step in its forward pass: its sequences' counters have moved
        # on, but until the pass ends those tokens are prefill still to do (as in vLLM, whose
        # scheduler updates the computed tokens after the step)
        self._step_prefill_tokens = 0
        self._sleeping = False
        self._loras: set[str] = set()  # adapters "loaded" (names only)

    async def start(self, hooks: EngineHooks) -> None:
        self._hooks = hooks
        self._task = asyncio.create_task(self._run(), name="mocker-loop")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None

    def add_request(self, request: EngineRequest, sink: OutputSink) -> None:
        sp = request.sampling
        rid = request.request_id
        seed = request_seed(rid, sp.seed)
        if request.prompt_embeds is not None:
            error = "mocker: prompt_embeds need an engine that embeds prompts (vLLM)"
            sink.on_output(EngineOutput(rid, (), True, "error", error=error))
            return
        if request.lora_name and request.lora_name not in self._loras:  # as vLLM refuses it
            error = f"LoRA adapter {request.lora_name!r} is not loaded on this worker"
            sink.on_output(EngineOutput(rid, (), True, "error", error=error))
            return
        forced: tuple[int, ...] = ()
        if sp.structured is not None:
            try:
                forced = self._forced(sp.structured, seed)
            except Unsatisfiable as exc:
                sink.on_output(EngineOutput(rid, (), True, "error", error=f"mocker: {exc}"))
                return
        params = request.kv_transfer_params or {}
        remote_prompt, hold = 0, bool(params.get("do_remote_decode"))
        if params.get("do_remote_prefill"):
            remote_prompt = int(str(params.get("remote_num_tokens", 0)))
            if not 0 < remote_prompt <= len(request.token_ids):
                error = f"mocker: remote_num_tokens {remote_prompt} does not fit the prompt"
                sink.on_output(EngineOutput(rid, (), True, "error", error=error))
                return
            # as vLLM's connector: the last prompt token is computed here (it gives the logits)
            remote_prompt = min(remote_prompt, len(request.token_ids) - 1)
            self._remote[rid] = (
                str(params.get("remote_engine_id", "")),
                str(params.get("remote_request_id", "")),
            )
        if request.task == "embed":
            if request.dimensions is not None and request.dimensions > self.hidden_size:
                error = f"dimensions must be at most {self.hidden_size}, got {request.dimensions}"
                sink.on_output(EngineOutput(rid, (), True, "error", error=error))
                return
            self._embeds[rid] = (tuple(request.token_ids), request.dimensions)
        if sp.logprobs is not None or sp.prompt_logprobs is not None:
            prompt = tuple(request.token_ids) if sp.prompt_logprobs is not None else None
            self._logprobs[rid] = _Logprobs(
                seed, request.num_generated_before, sp.logprobs, prompt, sp.prompt_logprobs or 0
            )
        self._sinks[rid] = sink
        self._scheduler.add_request(
            SeqRequest(
                request_id=rid,
                prompt_token_ids=tuple(request.token_ids),
                max_tokens=sp.max_tokens,
                seed=seed,
                lora_name=request.lora_name,
                first_position=request.num_generated_before,
                forced=forced,
                embed=request.task == "embed",
                remote_prompt=remote_prompt,
                hold=hold,
                stop_token_ids=frozenset(sp.stop_token_ids),
                min_tokens=sp.min_tokens,
                priority=request.priority,
            )
        )
        if hold:
            self._holding.add(rid)
        self._wake.set()

    def _forced(self, structured: StructuredOutput, seed: int) -> tuple[int, ...]:
        """The tokens of the text that satisfies ``structured`` for ``seed``."""
        if self._encode is None:
            raise Unsatisfiable("this mocker was started without a tokenizer")
        ids = tuple(self._encode(render(structured, seed)))
        if not ids:
            raise Unsatisfiable("the constrained text is empty")
        return ids

    def abort(self, request_id: str) -> bool:
        sink = self._sinks.pop(request_id, None)
        self._logprobs.pop(request_id, None)
        self._embeds.pop(request_id, None)
        self._holding.discard(request_id)
        self._transfer_ms.pop(request_id, None)
        self._notify_pulled(request_id)  # the prefill side need not hold the blocks any longer
        self._cancel_hold(request_id)
        found = self._scheduler.abort(request_id)
        self._flush_kv_events()
        if sink is not None:
            sink.on_output(EngineOutput(request_id, (), finished=True, finish_reason="abort"))
        return found or sink is not None

    def load(self) -> EngineLoad:
        st = self._scheduler.stats()
        return EngineLoad(
            num_running=st.num_running,
            num_waiting=st.num_waiting,
            max_num_seqs=self.max_num_seqs,
            kv_usage=st.kv_usage,
            num_gpu_blocks=self.num_gpu_blocks,
            block_size=self.block_size,
            active_decode_blocks=st.active_decode_blocks,
            active_prefill_tokens=st.active_prefill_tokens + self._step_prefill_tokens,
            num_preempted_total=st.num_preempted_total,
            prompt_tokens_total=st.prompt_tokens_total,
            cached_tokens_total=st.cached_tokens_total,
            step_ms=self._last_step_ms,
            num_cpu_blocks=self.config.num_cpu_blocks,
            num_host_blocks=st.num_host_blocks,
            host_cached_tokens_total=st.host_cached_tokens_total,
            steps_total=self._steps,
        )

    def lora_names(self) -> tuple[str, ...]:
        return tuple(sorted(self._loras))

    async def control(self, op: str, args: dict[str, str]) -> ControlResult:
        if op == "health":
            alive = self._task is not None and not self._task.done()
            return ControlResult(alive, "running" if alive else "engine loop stopped")
        if op == "clear_kv":
            ok = self._scheduler.reset_prefix_cache()
            self._flush_kv_events()
            return ControlResult(ok, "" if ok else "blocks in use; drain first")
        if op == "kv_resync":  # a KV indexer lost track: publish the whole cache again
            self._flush_kv_events()
            self._hooks.kv_events(self._scheduler.snapshot_events())
            return ControlResult(True, "cache republished")
        if op == "sleep":
            self._sleeping = True
            return ControlResult(True, "sleeping: new steps paused")
        if op == "wake":
            self._sleeping = False
            self._wake.set()
            return ControlResult(True, "awake")
        if op == "kv_release":  # the decode side pulled (or gave up on) a held prefill
            rid = args.get("request_id", "")
            self._cancel_hold(rid)
            found = self._scheduler.release_held(rid)
            self._flush_kv_events()
            return ControlResult(found, "" if found else f"no blocks held for {rid!r}")
        if op in ("lora_load", "lora_unload", "lora_list"):
            return self._lora_op(op, args.get("name", ""))
        return ControlResult(False, f"unknown op {op!r}")

    def _lora_op(self, op: str, name: str) -> ControlResult:
        """As vLLM's adapter answers them; the mocker has no weights, so an adapter only
        changes the hash seed of its requests' blocks (and where the router sends them)."""
        if op == "lora_list":
            return ControlResult(True, data={"loras": sorted(self._loras)})
        if not name:
            return ControlResult(False, f"{op} needs args name (and path to load)")
        if op == "lora_load":
            self._loras.add(name)
            return ControlResult(True, f"adapter {name!r} loaded")
        if name not in self._loras:
            return ControlResult(False, f"adapter {name!r} is not loaded")
        self._loras.discard(name)
        return ControlResult(True, f"adapter {name!r} unloaded")

    def _flush_kv_events(self) -> None:
        events = self._scheduler.take_events()
        if events:
            self._hooks.kv_events(events)

    def _dispatch(self, outputs) -> None:  # type: ignore[no-untyped-def]
        sinks = self._sinks
        for out in outputs:
            sink = sinks.get(out.request_id)
            if sink is None:
                continue
            if out.finished:
                del sinks[out.request_id]
            lp = self._logprobs.get(out.request_id) if self._logprobs else None
            logprobs = prompt_lps = None
            if lp is not None:
                logprobs, prompt_lps = self._logprobs_of(out, lp)
                if out.finished:
                    del self._logprobs[out.request_id]
            transfer_ms = self._transfer_ms.pop(out.request_id, 0.0) if self._transfer_ms else 0
            params = None
            if out.finished and out.request_id in self._holding:
                params = self._hold(out)
            vector = None
            if out.finished and self._embeds:
                embed = self._embeds.pop(out.request_id, None)
                if embed is not None and out.finish_reason == "stop":
                    vector = embedding(embed[0], self.hidden_size, embed[1])
            sink.on_output(
                EngineOutput(
                    request_id=out.request_id,
                    new_token_ids=out.new_token_ids,
                    finished=out.finished,
                    finish_reason=out.finish_reason,
                    num_prompt_tokens=out.num_prompt_tokens,
                    num_cached_tokens=out.num_cached_tokens,
                    num_host_cached_tokens=out.num_host_tokens,
                    logprobs=logprobs,
                    prompt_logprobs=prompt_lps,
                    embedding=vector,
                    kv_transfer_params=params,
                    kv_transfer_ms=transfer_ms,
                )
            )

    def _hold(self, out: SeqOutput) -> dict[str, object] | None:
        """A finished prefill for a remote decode: its blocks stay until the decode side says
        it pulled them (``kv_release``) or ``kv_hold_timeout_s`` passes; the parameters the
        decode worker needs."""
        rid = out.request_id
        self._holding.discard(rid)
        if out.finish_reason == "error":
            return None
        loop = asyncio.get_running_loop()
        self._hold_timers[rid] = loop.call_later(
            self.config.kv_hold_timeout_s / self.config.speedup, self._hold_expired, rid
        )
        return {
            "do_remote_prefill": True,
            "remote_engine_id": self.engine_id,
            "remote_request_id": rid,
            "remote_num_tokens": out.num_prompt_tokens,
        }

    def _hold_expired(self, rid: str) -> None:
        self._hold_timers.pop(rid, None)
        if self._scheduler.release_held(rid):
            log.warning("kv_hold_expired", request_id=rid)
            self._flush_kv_events()

    def _cancel_hold(self, rid: str) -> None:
        timer = self._hold_timers.pop(rid, None)
        if timer is not None:
            timer.cancel()

    def _notify_pulled(self, rid: str) -> None:
        remote = self._remote.pop(rid, None)
        if remote is not None and remote[0]:
            self._hooks.kv_pulled(*remote)

    def _landed(self, transfers: tuple[tuple[str, float], ...]) -> None:
        for rid, ms in transfers:
            self._transfer_ms[rid] = ms
            self._notify_pulled(rid)

    def _logprobs_of(
        self, out: SeqOutput, lp: _Logprobs
    ) -> tuple[tuple[TokenLogprob, ...] | None, tuple[TokenLogprob | None, ...] | None]:
        logprobs = None
        if lp.k is not None:
            first = lp.first_position + out.num_output_tokens - len(out.new_token_ids)
            logprobs = tuple(
                token_logprob(self._source, lp.seed, first + i, t, lp.k)
                for i, t in enumerate(out.new_token_ids)
            )
        prompt = None
        if lp.prompt is not None and out.num_output_tokens <= 1:  # the first output
            prompt = prompt_logprobs(self._source, lp.prompt, lp.prompt_k)
        return logprobs, prompt

    async def _run(self) -> None:
        speedup = self.config.speedup
        clock = time.monotonic
        next_at = clock()
        while True:
            if self._sleeping or not self._scheduler.has_work:
                self._wake.clear()
                await self._wake.wait()
                next_at = clock()
                continue
            try:
                result = self._scheduler.step()
            except Exception:  # a bug in the core must not wedge every request silently
                log.exception("mocker_step_failed")
                self._fail_all("engine step failed")
                continue
            self._last_step_ms = result.simulated_ms
            self._step_prefill_tokens = result.num_prefill_tokens
            self._steps += 1
            # The step's results exist when its forward pass ends, as on a GPU: sleep first.
            next_at = max(next_at + result.simulated_ms / 1000.0 / speedup, clock() - 0.05)
            delay = next_at - clock()
            await asyncio.sleep(delay if delay > 0 else 0)
            self._step_prefill_tokens = 0
            if result.transfers_done:
                self._landed(result.transfers_done)
            self._dispatch(result.outputs)
            self._flush_kv_events()

    def _fail_all(self, reason: str) -> None:
        for rid in list(self._sinks):
            self._scheduler.abort(rid)
            self._logprobs.pop(rid, None)
            self._embeds.pop(rid, None)
            sink = self._sinks.pop(rid)
            sink.on_output(EngineOutput(rid, (), True, "error", error=reason))
