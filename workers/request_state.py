"""One in-flight request on a worker: collects engine outputs, cuts them into ``TokenChunk``s.

Pure (no I/O): the runtime calls ``take_chunk()`` when it flushes. The first tokens of a request
and its end are marked urgent so the runtime flushes them at once; later tokens wait for the next
periodic flush, so one chunk carries several tokens and no token waits longer than the interval.
"""

from __future__ import annotations

from collections.abc import Callable

from nats.aio.msg import Msg

from base.tracing import Span
from schemas import Request, TokenChunk, TokenLogprob, Usage
from workers.engine import EngineOutput


class ActiveRequest:
    __slots__ = (
        "_detok",
        "_on_ready",
        "_pending_logprobs",
        "_pending_text",
        "_pending_tokens",
        "_prompt_logprobs",
        "cached_tokens",
        "embedding",
        "error",
        "final_sent",
        "finish_reason",
        "finished",
        "host_cached_tokens",
        "kv_transfer_ms",
        "kv_transfer_params",
        "last_output_at",
        "msg",
        "next_index",
        "num_generated",
        "prompt_tokens",
        "request",
        "span",
        "started_at",
        "worker_id",
    )

    def __init__(
        self,
        request: Request,
        msg: Msg,
        worker_id: str,
        detokenize: Callable[[int], str] | None,
        on_ready: Callable[[ActiveRequest, bool], None],
        started_at: float,
    ) -> None:
        self.request = request
        self.msg = msg  # the JetStream message, acked when the request ends
        self.worker_id = worker_id
        self._detok = detokenize
        self._on_ready = on_ready  # (self, urgent) -> runtime schedules a flush
        self._pending_tokens: list[int] = []
        self._pending_text: list[str] = []
        self._pending_logprobs: list[TokenLogprob] | None = (
            [] if request.sampling.logprobs is not None else None
        )
        self._prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
        self.next_index = 0
        self.num_generated = 0
        self.prompt_tokens = len(request.token_ids)
        self.cached_tokens = 0
        self.host_cached_tokens = 0
        self.finished = False
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.kv_transfer_params: dict[str, object] | None = None
        self.embedding: tuple[float, ...] | None = None
        self.kv_transfer_ms = 0.0
        self.started_at = started_at
        self.last_output_at = started_at  # when the runtime was last told of new output
        self.final_sent = False
        self.span: Span | None = None  # exported with OpenTelemetry when configured

    # OutputSink
    def on_output(self, output: EngineOutput) -> None:
        if self.finished:
            return
        if output.num_prompt_tokens:
            self.prompt_tokens = output.num_prompt_tokens
        if output.num_cached_tokens:
            self.cached_tokens = output.num_cached_tokens
            self.host_cached_tokens = output.num_host_cached_tokens
        if output.kv_transfer_ms:
            self.kv_transfer_ms = output.kv_transfer_ms
        if output.new_token_ids:
            self._pending_tokens.extend(output.new_token_ids)
            if self._detok is not None:
                step = self._detok
                self._pending_text.extend(step(t) for t in output.new_token_ids)
            if self._pending_logprobs is not None and output.logprobs is not None:
                self._pending_logprobs.extend(output.logprobs)
        if output.prompt_logprobs is not None:
            self._prompt_logprobs = output.prompt_logprobs
        first = self.num_generated == 0 and bool(output.new_token_ids)
        self.num_generated += len(output.new_token_ids)
        if output.finished:
            self.finished = True
            self.finish_reason = output.finish_reason
            self.error = output.error
            self.kv_transfer_params = output.kv_transfer_params
            self.embedding = output.embedding
        self._on_ready(self, first or output.finished)

    def has_pending(self) -> bool:
        return bool(self._pending_tokens) or (self.finished and not self.final_sent)

    def take_chunk(self) -> TokenChunk:
        """The chunk to publish now (tokens since the last one; final fields when finished)."""
        tokens = tuple(self._pending_tokens)
        text = "".join(self._pending_text)
        self._pending_tokens.clear()
        self._pending_text.clear()
        logprobs = None
        if self._pending_logprobs is not None:
            logprobs = tuple(self._pending_logprobs)
            self._pending_logprobs.clear()
        prompt_logprobs, self._prompt_logprobs = self._prompt_logprobs, None
        final = self.finished and not self.final_sent
        chunk = TokenChunk(
            request_id=self.request.request_id,
            attempt=self.request.attempt,
            index=self.next_index,
            token_ids=tokens,
            text=text,
            finish_reason=self.finish_reason if final else None,
            usage=(
                Usage(
                    self.prompt_tokens,
                    self.num_generated,
                    self.cached_tokens,
                    self.kv_transfer_ms,
                    self.host_cached_tokens,
                )
                if final
                else None
            ),
            error=self.error if final else None,
            worker_id=self.worker_id,
            kv_transfer_params=self.kv_transfer_params if final else None,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            embedding=self.embedding if final else None,
            generated_before=(
                self.request.num_generated_before
                if self.next_index == 0 and self.request.attempt > 0
                else None
            ),
        )
        self.next_index += 1
        if final:
            self.final_sent = True  # the final chunk goes out once
        return chunk
