"""Load for the checker: HTTP clients (streamed completions from the frontend) and NATS-only
clients (a tokenized ``Request`` submitted on ``fleet.submit.{model}``, chunks read from
``fleet.tok.{request_id}``), each request recorded as a ``Trace`` (``tests.chaos.checker``).

The NATS-only client follows the protocol of docs/using/nats-clients.md (subscribe first, submit
with a message id, read with ``schemas.token_reader.TokenReader``: repeats and older attempts
dropped, cut back when a migrated attempt begins) and retries an unacknowledged submit under the
same message id for up to 10 s, as the frontend does. After its own connection came back, it
reads a request's chunks again from ``FLEET_TOKENS`` into a fresh reader (in the stream's order,
then what it saw live that the stream lost), since core NATS does not redeliver what was in
flight to the server it lost. What reached the wire is judged apart: a token stream that carried
an older attempt's chunk after a newer one's marks its request (``mark_interleaved``).

Every request has a seed from a small set: the mocker's output is a function of the seed alone,
so ``references`` (one undisturbed request per seed and kind, before the faults) is the answer
every request with that seed must show.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Sequence

import httpx
from nats.aio.client import Client as NATS
from nats.js import api

from base.connect import connect_nats
from schemas import Request, SamplingParams, Subjects, TokenChunk, decode, encode
from schemas.token_reader import TokenReader
from tests.chaos.checker import Trace, attempts_interleaved

MODEL = "jetfleet-tiny"


class Load:
    def __init__(
        self,
        base_url: str,
        nats_url: str,
        subjects: Subjects,
        seeds: int = 8,
        max_tokens: int = 64,
        bound_s: float = 120.0,
    ) -> None:
        self.base_url = base_url
        self.nats_url = nats_url
        self.subjects = subjects
        self.seeds = seeds
        self.max_tokens = max_tokens
        self.bound_s = bound_s  # a request not ended this long after it was sent is lost (a hang)
        self.traces: list[Trace] = []
        self.references: dict[tuple[str, int], Sequence[object]] = {}
        self._nc: NATS | None = None
        self._reconnected_at: list[float] = []
        self._http: httpx.AsyncClient | None = None
        self._n = 0

    async def __aenter__(self) -> Load:
        async def on_reconnect() -> None:
            self._reconnected_at.append(time.monotonic())

        async def quiet(_exc: Exception) -> None:  # every failed reconnect of an outage
            return None

        self._nc = await connect_nats(
            self.nats_url, "chaos-load", on_reconnect=[on_reconnect], error_cb=quiet
        )
        timeout = httpx.Timeout(connect=5.0, read=self.bound_s, write=10.0, pool=self.bound_s)
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        self._http = httpx.AsyncClient(timeout=timeout, limits=limits)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.aclose()
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()

    # ------------------------------------------------------------------ references
    async def take_references(self) -> None:
        """One undisturbed request per seed and kind: the answers every later one must show."""
        for seed in range(self.seeds):
            for kind in ("http", "nats"):
                trace = await self.one(kind, seed, record=False)
                assert trace.end.startswith("finish:"), (kind, seed, trace.end)
                self.references[(kind, seed)] = list(trace.output)

    # ------------------------------------------------------------------ load
    async def run(self, http: int, nats: int, stop: asyncio.Event, total: int = 0) -> None:
        """``http`` + ``nats`` clients, each sending one request after another until ``stop``
        is set (or ``total`` requests were sent)."""

        async def client(kind: str) -> None:
            while not stop.is_set() and not (total and self._n >= total):
                self._n += 1
                await self.one(kind, self._n % self.seeds)

        loops = [client("http") for _ in range(http)] + [client("nats") for _ in range(nats)]
        await asyncio.gather(*loops)

    async def one(self, kind: str, seed: int, record: bool = True) -> Trace:
        rid = f"chaos-{uuid.uuid4().hex[:16]}"
        trace = Trace(rid, kind, seed, time.monotonic())
        if record:
            self.traces.append(trace)
        work = _http_request(self, trace) if kind == "http" else self._nats_request(trace)
        with contextlib.suppress(TimeoutError):  # past the bound: left unended, a hang
            await asyncio.wait_for(work, self.bound_s)
        return trace

    async def _nats_request(self, trace: Trace) -> None:
        nc = self._nc
        assert nc is not None
        s = self.subjects
        prompt = f"chaos over NATS {trace.request_id} shared head " * 2
        req = Request(
            request_id=trace.request_id,
            model=MODEL,
            token_ids=tuple(prompt.encode()),
            sampling=SamplingParams(max_tokens=self.max_tokens, seed=trace.seed),
        )
        sub = await nc.subscribe(s.tok(trace.request_id))
        try:
            if not await self._submit(req):
                trace.end, trace.ended_at = "refused:submit not acknowledged", time.monotonic()
                return
            trace.accepted_at = time.monotonic()
            reader, live = TokenReader(), []
            caught_up = len(self._reconnected_at)
            while not trace.ended_at:
                try:
                    msg = await sub.next_msg(timeout=1.0)
                except Exception:  # quiet: if this client reconnected meanwhile, catch up
                    if len(self._reconnected_at) > caught_up:
                        caught_up = len(self._reconnected_at)
                        reader = await self._fill_gaps(trace, live, reader)
                    continue
                chunk = decode(msg.data, TokenChunk)
                live.append(chunk)
                if reader.take(chunk) is not None:
                    trace.arrivals.append(time.monotonic())
                    self._show(trace, reader)
            if any(trace.sent_at <= t for t in self._reconnected_at):
                await self._fill_gaps(trace, live, reader)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    @staticmethod
    def _show(trace: Trace, reader: TokenReader) -> None:
        """The answer as the reader has it; the end once its final chunk came."""
        trace.output = list(reader.token_ids)
        final = reader.final
        if final is None or trace.ended_at:
            return
        trace.ended_at = time.monotonic()
        reason = final.finish_reason
        trace.end = f"error:{final.error}" if reason == "error" else f"finish:{reason}"

    async def _submit(self, req: Request, for_s: float = 10.0) -> bool:
        assert self._nc is not None
        js = self._nc.jetstream()
        headers = {"Nats-Msg-Id": f"{req.request_id}:submit"}
        deadline = time.monotonic() + for_s
        while time.monotonic() < deadline:
            try:
                await js.publish(self.subjects.submit(req.model), encode(req), headers=headers)
                return True
            except Exception:
                await asyncio.sleep(0.25)
        return False

    async def _fill_gaps(
        self, trace: Trace, live: list[TokenChunk], reader: TokenReader
    ) -> TokenReader:
        """After its connection came back (as the protocol says): the chunks the stream holds
        (what went by while it was away, the final one too), in the stream's order, then those
        it saw live that the stream lost, into a fresh reader."""
        try:
            stored = await self.stream_chunks(self.subjects.tok(trace.request_id))
        except Exception:  # the stream electing: the next quiet second retries
            return reader
        fresh = TokenReader()
        for chunk in [*stored, *live]:
            fresh.take(chunk)
        self._show(trace, fresh)
        return fresh

    async def stream_chunks(self, subject: str, idle_s: float = 2.0) -> list[TokenChunk]:
        """Every chunk ``FLEET_TOKENS`` holds on ``subject`` (wildcards too), in stream order."""
        assert self._nc is not None
        js = self._nc.jetstream()
        stream = self.subjects.stream_name("TOKENS")
        last = (await js.stream_info(stream)).state.last_seq
        sub = await js.subscribe(subject, stream=stream, ordered_consumer=True,
                                 deliver_policy=api.DeliverPolicy.ALL)  # fmt: skip
        out: list[TokenChunk] = []
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=idle_s)
                except Exception:
                    break
                out.append(decode(msg.data, TokenChunk))
                if msg.metadata.sequence.stream >= last:
                    break
        finally:
            await sub.unsubscribe()
        return out

    async def mark_interleaved(self) -> int:
        """Read the whole token stream; mark each request whose stream carried an older
        attempt's chunk after a newer one. Returns how many."""
        chunks = await self.stream_chunks(self.subjects.tok_all())
        bad = attempts_interleaved((c.request_id, c.attempt) for c in chunks)
        for trace in self.traces:
            trace.interleaved = bool({trace.request_id, f"cmpl-{trace.request_id}"} & bad)
        return len(bad)


async def _http_request(load: Load, trace: Trace) -> None:
    http = load._http
    assert http is not None
    body = {
        "model": MODEL,
        "prompt": f"chaos over HTTP shared head {trace.request_id} " * 2,
        "max_tokens": load.max_tokens,
        "seed": trace.seed,
        "stream": True,
    }
    try:
        url, headers = f"{load.base_url}/v1/completions", {"X-Request-Id": trace.request_id}
        async with http.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")[:200]
                trace.end, trace.ended_at = f"refused:{r.status_code} {text}", time.monotonic()
                return
            trace.accepted_at = time.monotonic()
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    if not trace.end:
                        trace.end = "cut:[DONE] without a finish reason"
                    trace.ended_at = trace.ended_at or time.monotonic()
                    return
                event = json.loads(line[6:])
                trace.arrivals.append(time.monotonic())
                if "error" in event:
                    trace.end, trace.ended_at = f"error:{event['error']}", time.monotonic()
                    continue
                choice = event["choices"][0]
                trace.output.append(choice.get("text") or "")
                if choice.get("finish_reason"):
                    trace.end = f"finish:{choice['finish_reason']}"
            if not trace.ended_at:
                trace.end, trace.ended_at = "cut:stream closed before [DONE]", time.monotonic()
    except httpx.HTTPError as exc:
        now = time.monotonic()
        if trace.accepted:
            trace.end, trace.ended_at = f"cut:{type(exc).__name__}", now
        else:
            trace.end, trace.ended_at = f"refused:{type(exc).__name__} {exc}", now
