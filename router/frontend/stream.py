"""A request's choices as the client gets them: chunks in, deltas out, as SSE or one response.

Each choice (``Choice``: one ``Generation`` of an ``n``-choice request) turns its chunks into
deltas: stop strings (``StopMatcher``: the frontend applies them, and cancels the generation
when one matches), then the choice's output pipeline (``ChoiceOutput``: reasoning, tool calls),
the echoed prompt before the first token, and the logprobs in the endpoint's shape. ``events``
merges every choice's deltas in arrival order. ``stream`` sends them as SSE through the
request's ``ResponseShape`` (events that are already here go out in one write); ``collect``
sums them into the whole response. A failed choice is an error event in a stream, a 500 in a
whole response.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from router.frontend import asgi
from router.frontend.errors import OpenAIError
from router.frontend.logprobs import CompletionLogprobs, chat_content, merge_completion
from router.frontend.output import ChoiceOutput, Delta, OutCall
from router.frontend.shapes import FullChoice, ResponseShape, usage_body
from router.frontend.stops import StopMatcher
from router.generation import Generation
from router.takeover import TakenOver
from schemas import TokenChunk

AnyGeneration = Generation | TakenOver
Event = tuple[int, Delta, str | None, Any]  # choice index, delta, finish reason, its logprobs


@dataclass
class Choice:
    gen: AnyGeneration
    stops: StopMatcher
    out: ChoiceOutput
    echo: str | None = None  # completions echo: the prompt text, sent before the first token
    text: list[str] = field(default_factory=list)  # content
    reasoning: list[str] = field(default_factory=list)
    calls: list[OutCall] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)  # chat entries / completions parts
    reason: str | None = None
    first_at: float = 0.0  # monotonic: first token, last token
    last_at: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class LogprobsAsk:
    """How one request's logprobs are shaped (None fields: not asked)."""

    k: int | None  # top-k per generated token
    echo_k: int | None  # completions echo with logprobs: prompt tokens too
    chat: bool
    token_text: Callable[[int], str]


class Choices:
    """The choices of one request; ``on_gap(seconds, n)`` hears ``n`` inter-token gaps of
    ``seconds`` each (a chunk of ``n`` tokens spreads its gap over them)."""

    def __init__(
        self,
        choices: list[Choice],
        prompt_len: int,
        lp: LogprobsAsk | None,
        on_gap: Callable[[float, int], None],
    ) -> None:
        self.choices = choices
        self.prompt_len = prompt_len
        self.lp = lp
        self.on_gap = on_gap

    def usage(self) -> dict[str, Any]:
        completion = sum(len(c.gen.generated) for c in self.choices)
        cached = max((c.gen.cached_tokens for c in self.choices), default=0)
        return usage_body(self.prompt_len, completion, cached)

    async def events(self) -> AsyncIterator[Event]:
        """Every choice's events in arrival order."""
        if len(self.choices) == 1:
            async for item in self._choice_events(0, self.choices[0]):
                yield item
            return
        queue: asyncio.Queue[Event | None] = asyncio.Queue()

        async def pump(i: int, c: Choice) -> None:
            try:
                async for item in self._choice_events(i, c):
                    queue.put_nowait(item)
            finally:
                queue.put_nowait(None)

        tasks = [asyncio.create_task(pump(i, c)) for i, c in enumerate(self.choices)]
        try:
            remaining = len(tasks)
            while remaining:
                got = await queue.get()
                if got is None:
                    remaining -= 1
                else:
                    yield got
        finally:
            for t in tasks:
                t.cancel()

    async def _choice_events(self, i: int, c: Choice) -> AsyncIterator[Event]:
        async for chunk in c.gen:
            self._time(c, chunk)
            text = c.stops.feed(chunk.text)
            reason = chunk.finish_reason
            if c.stops.stopped:
                reason = "stop"
                await c.gen.cancel("stop_string")
            elif reason is not None:
                text += c.stops.flush()
                if reason == "error":
                    c.error = chunk.error or "generation failed"
                elif reason == "abort":
                    c.error = "generation aborted by the worker"
                    reason = "error"
            delta = c.out.feed(text)
            if reason is not None and reason != "error":
                tail, reason = c.out.finish(reason)
                delta = Delta(
                    delta.content + tail.content, delta.reasoning + tail.reasoning, tail.tool_calls
                )
            if c.echo is not None:
                delta.content = c.echo + delta.content
                c.echo = None
            logprobs = self._logprobs(c, chunk, self.lp) if self.lp is not None else None
            if delta.content:
                c.text.append(delta.content)
            if delta.reasoning:
                c.reasoning.append(delta.reasoning)
            c.calls.extend(delta.tool_calls)
            if reason is not None:
                c.reason = reason
            yield i, delta, reason, logprobs
            if reason is not None:
                return

    def _time(self, c: Choice, chunk: TokenChunk) -> None:
        if not chunk.token_ids:
            return
        now = time.monotonic()
        if not c.first_at:
            c.first_at = now
        else:  # inter-token latency, per token: a chunk's gap spread over its tokens
            n = len(chunk.token_ids)
            self.on_gap((now - c.last_at) / n, n)
        c.last_at = now

    @staticmethod
    def _logprobs(c: Choice, chunk: TokenChunk, lp: LogprobsAsk) -> Any:
        """This chunk's logprobs in the endpoint's shape (kept for the whole response too)."""
        ids, values = chunk.token_ids, chunk.logprobs or ()
        if lp.chat:
            entries = chat_content(lp.token_text, ids, values, lp.k or 0)
            c.logprobs.extend(entries)
            return entries
        if not c.logprobs:
            c.logprobs.append(CompletionLogprobs(lp.token_text, lp.k or 0))
        acc: CompletionLogprobs = c.logprobs[0]
        parts = []
        if lp.echo_k is not None and len(c.logprobs) == 1:  # the prompt first, once
            prompt = c.gen.request.token_ids[: c.gen.prompt_len]
            parts.append(acc.add(prompt, chunk.prompt_logprobs or (None,) * len(prompt)))
        if lp.k is not None:
            parts.append(acc.add(ids, values))
        merged = merge_completion(parts) or {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        c.logprobs.append(merged)
        return merged

    def _full_logprobs(self, c: Choice) -> Any:
        if self.lp is None:
            return None
        if self.lp.chat:
            return c.logprobs
        return merge_completion(c.logprobs[1:]) if c.logprobs else None

    # ---- the two ways out
    async def stream(self, send: asgi.Send, shape: ResponseShape, include_usage: bool) -> None:
        await asgi.start_sse(send)
        head = shape.start(len(self.choices))
        if head:
            await asgi.send_sse(send, head)
        pending: list[bytes] = []  # events already here go out in one write
        async for i, delta, reason, logprobs in self.events():
            if reason == "error":
                error = self.choices[i].error or "generation failed"
                pending.append(shape.error(OpenAIError(500, error, type="server_error")))
            elif delta or reason is not None or logprobs:
                if reason is not None:
                    shape.finish(reason, self.choices[i].stops.matched)
                pending.append(shape.delta_chunk(i, delta, reason, logprobs))
            if pending and not any(c.gen.pending for c in self.choices):
                await asgi.send_sse(send, b"".join(pending))
                pending.clear()
        if pending:
            await asgi.send_sse(send, b"".join(pending))
        await asgi.end_sse(send, shape.end(self.usage(), include_usage))

    async def collect(self, send: asgi.Send, shape: ResponseShape) -> None:
        async for _ in self.events():
            pass
        failed = [c.error for c in self.choices if c.error]
        if failed:
            err = OpenAIError(500, failed[0], type="server_error")
            await asgi.send_json(send, 500, shape.error_json(err))
            return
        first = self.choices[0]
        shape.finish(first.reason, first.stops.matched)
        full = [
            FullChoice(
                "".join(c.text), c.reason, "".join(c.reasoning), c.calls, self._full_logprobs(c)
            )
            for c in self.choices
        ]
        await asgi.send_json(send, 200, shape.full(full, self.usage()))
