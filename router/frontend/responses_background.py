"""Background responses: run on the fleet with no client attached, read and resumed from any
frontend, taken over by another when the frontend running one dies.

A background response runs as a streamed one whose ASGI ``send`` is an ``EventSink``: every
event goes into ``FLEET_RESPONSES`` (``responses_store.py``) and each change of status into the
stored response object. The frontend running it holds a lease in ``responses_running`` and
renews it every ``RENEW_S``; a ``POST .../cancel`` on any frontend is stored on
``fleet.resp.cancel.{id}``, which the frontend running it hears: it stops the generation (the
worker aborts). A frontend taking a response over that was asked to cancel ends it so.

Every frontend watches ``responses_running``. One whose lease ran out ``LEASE_S`` ago (its
frontend died, or was cut off) is claimed by the first frontend whose compare-and-set on the
lease wins, which runs it on: the events already stored are not sent again (``skip_through``),
the answer so far is read back from ``FLEET_TOKENS`` and continued by a new attempt
(``router/takeover.py``). The frontend's output path is deterministic in the chunks, so the
events it makes again are the ones stored, and the new ones follow them without a gap. A
frontend that stops (SIGTERM) gives its leases up, so another takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import structlog
from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from router.frontend import asgi
from router.frontend.errors import OpenAIError
from router.frontend.leases import follow_leases
from router.frontend.responses_store import (
    TERMINAL_EVENTS,
    Lease,
    ResponsesStore,
    RunRecord,
)
from router.takeover import TakenOver, answer_so_far, next_request
from schemas import Request

log = structlog.get_logger("jetfleet.responses")

LEASE_S = 10.0  # a lease not renewed for this long lets another frontend take the response over
RENEW_S = 3.0
CHECK_S = 1.0  # how often a frontend looks for leases run out


TakeOverWork = Callable[[str, "RunRecord | None", asgi.Call, "EventSink"], Awaitable[None]]


def _now_ms() -> int:
    return int(time.time() * 1000)


def background_call(
    send: asgi.Send, request_id: str, max_body_mb: float, stop: asyncio.Event
) -> asgi.Call:
    """The ASGI call a background response runs as: no client, so its ``receive`` says the
    client left once ``stop`` is set (a cancel): the generation's disconnect watcher stops it
    as it stops one whose client went away, and sends the cancel again should one be lost."""

    async def receive() -> dict[str, Any]:
        await stop.wait()
        return {"type": "http.disconnect"}

    scope: asgi.Scope = {"type": "http", "path": "/v1/responses", "method": "POST", "headers": []}
    ctx: dict[str, Any] = {"request_id": request_id, "background": True}
    return asgi.Call(scope, receive, send, ctx, "", time.monotonic(), max_body_mb)


@dataclass
class EventSink:
    """The ``send`` of a background response: its SSE events into the store (those up to
    ``skip_through`` were stored by an earlier run: not again), its status into the object."""

    store: ResponsesStore
    response_id: str
    skip_through: int = -1
    last_seq: int = -1
    last_object: dict[str, Any] | None = None
    terminal: str | None = None
    http_status: int = 200
    error_body: bytes = b""
    _buf: bytes = b""

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.http_status = int(message["status"])
            return
        body = message.get("body", b"")
        if self.http_status != 200:  # refused before it ran: an OpenAI error object
            self.error_body += body
            return
        self._buf += body
        while b"\n\n" in self._buf:
            raw, self._buf = self._buf.split(b"\n\n", 1)
            await self._event(raw)

    async def _event(self, raw: bytes) -> None:
        head, _, data = raw.partition(b"\ndata: ")
        kind = head.removeprefix(b"event: ").decode()
        event = json.loads(data)
        seq = int(event["sequence_number"])
        self.last_seq = seq
        if seq > self.skip_through:
            await self.store.append_event(self.response_id, seq, kind, data)
        response = event.get("response")
        if isinstance(response, dict):
            self.last_object = response
            if seq > self.skip_through or kind in TERMINAL_EVENTS:
                await self.store.put_object(response)
        if kind in TERMINAL_EVENTS:
            self.terminal = kind
        elif kind == "error":
            self.terminal = "error"

    async def end(self, status: str, error: dict[str, Any] | None) -> None:
        """Close a run that made no terminal event (it failed or was cancelled): one more
        event, ``response.failed`` or ``response.cancelled``, and the object in that status."""
        base = self.last_object or await self.store.get_object(self.response_id) or {}
        response = {**base, "status": status, "error": error}
        seq = self.last_seq + 1
        kind = "response.cancelled" if status == "cancelled" else "response.failed"
        data = {"type": kind, "sequence_number": seq, "response": response}
        await self.store.append_event(
            self.response_id, seq, kind, json.dumps(data, separators=(",", ":")).encode()
        )
        await self.store.put_object(response)
        self.terminal = kind


@dataclass
class _Running:
    task: asyncio.Task[None]
    call: asgi.Call
    revision: int
    lease: Lease
    stop: asyncio.Event  # set by a cancel: the call's client "leaves"
    cancelled: bool = False
    handing_over: bool = False


@dataclass
class BackgroundRunner:
    """The background responses of one frontend (and the leases of every frontend's)."""

    store: ResponsesStore
    frontend_id: str
    cancel_request: Callable[[str, str], Awaitable[None]]  # (engine request id, reason)
    start_request: Callable[[Request], Awaitable[Any]]  # routes and publishes: a Generation
    max_body_mb: float = 32.0
    lease_s: float = LEASE_S
    running: dict[str, _Running] = field(default_factory=dict)
    leases: dict[str, tuple[Lease, int]] = field(default_factory=dict)  # every frontend's
    take_over_work: TakeOverWork | None = None  # set by the endpoints (responses_endpoints.py)
    _kv: KeyValue | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self) -> None:
        self._kv = await self.store.running()
        self._tasks = [
            asyncio.create_task(self._watch(), name="responses-leases"),
            asyncio.create_task(self._keep(), name="responses-keeper"),
        ]
        await self.store.nc.subscribe(self.store.subjects.resp_cancels(), cb=self._on_cancel)

    async def stop(self) -> None:
        """Stop every background response here and give its lease up: another frontend takes
        it over at once (from what its worker published)."""
        for t in self._tasks:
            t.cancel()
        stopping = list(self.running.items())
        for _rid, run in stopping:
            run.handing_over = True
            run.task.cancel()
        for rid, run in stopping:
            with contextlib.suppress(BaseException):
                await run.task
            with contextlib.suppress(Exception):
                gone = msgspec.structs.replace(run.lease, until_ms=0)
                await self._put_lease(rid, gone, run.revision)

    # ---- running one
    async def launch(
        self,
        response_id: str,
        engine_request_id: str,
        work: Callable[[asgi.Call, EventSink], Awaitable[None]],
        skip_through: int = -1,
        lease_revision: int | None = None,
    ) -> None:
        """Run ``work`` (the generation, given the background call) under a lease."""
        lease = Lease(self.frontend_id, self._until(), engine_request_id)
        assert self._kv is not None
        if lease_revision is None:
            revision = await self._kv.create(response_id, msgspec.msgpack.encode(lease))
        else:
            revision = lease_revision
        sink = EventSink(self.store, response_id, skip_through)
        stop = asyncio.Event()
        call = background_call(sink, engine_request_id.split("-", 1)[-1], self.max_body_mb, stop)
        task = asyncio.create_task(self._run(response_id, call, sink, work))
        self.running[response_id] = _Running(task, call, revision, lease, stop)

    async def _run(
        self,
        response_id: str,
        call: asgi.Call,
        sink: EventSink,
        work: Callable[[asgi.Call, EventSink], Awaitable[None]],
    ) -> None:
        error: dict[str, Any] | None = None
        try:
            await work(call, sink)
        except asyncio.CancelledError:  # before its generation began (which ends it quietly)
            run = self.running.get(response_id)
            if run is None or run.handing_over:
                self.running.pop(response_id, None)
                raise
            asgi.settle_cancellation()
        except OpenAIError as err:
            error = {"code": err.code or err.type, "message": err.message}
        except Exception as exc:
            log.exception("background_response_failed", response_id=response_id)
            error = {"code": "server_error", "message": str(exc)}
        run = self.running.pop(response_id, None)
        if run is not None and run.handing_over:
            return
        try:
            if sink.terminal in (None, "error"):
                if sink.error_body:
                    refused = json.loads(sink.error_body).get("error", {})
                    code = refused.get("code") or refused.get("type")
                    error = {"code": code, "message": refused.get("message", "")}
                cancelled = run is not None and run.cancelled
                status = "cancelled" if cancelled and error is None else "failed"
                await sink.end(status, error if status == "failed" else None)
        finally:
            if self._kv is not None and run is not None:
                with contextlib.suppress(Exception):
                    await self._kv.delete(response_id)

    async def cancel(self, response_id: str) -> None:
        """Any frontend: ask the one running it to stop (kept: one taking it over sees it)."""
        await self.store.js.publish(self.store.subjects.resp("cancel", response_id), b"")

    async def _on_cancel(self, msg: Any) -> None:
        response_id = msg.subject.rsplit(".", 1)[-1]
        run = self.running.get(response_id)
        if run is not None and not run.task.done():
            run.cancelled = True
            run.stop.set()  # a generation under way: its disconnect watcher stops it
            run.task.cancel()  # one not begun yet (or begun: the watcher's cancels make sure)

    # ---- leases
    def _until(self) -> int:
        return _now_ms() + int(self.lease_s * 1000)

    async def _put_lease(self, response_id: str, lease: Lease, revision: int) -> int:
        assert self._kv is not None
        return int(await self._kv.update(response_id, msgspec.msgpack.encode(lease), revision))

    async def _watch(self) -> None:
        assert self._kv is not None
        await follow_leases(self._kv, Lease, self.leases)

    async def _keep(self) -> None:
        last_renew = 0.0
        while True:
            await asyncio.sleep(CHECK_S)
            now = time.monotonic()
            if now - last_renew >= min(RENEW_S, self.lease_s / 3):
                last_renew = now
                await self._renew()
            await self._claim_expired()

    async def _renew(self) -> None:
        for rid, run in list(self.running.items()):
            lease = msgspec.structs.replace(run.lease, until_ms=self._until())
            try:
                run.revision = await self._put_lease(rid, lease, run.revision)
                run.lease = lease
            except KeyWrongLastSequenceError:  # another frontend took it over: let it go here
                log.warning("background_response_taken", response_id=rid)
                run.handing_over = True
                run.call.ctx["handed_over"] = True  # its attempt is the taker's to stop
                run.task.cancel()
            except Exception as exc:
                log.warning("lease_renew_failed", response_id=rid, error=str(exc))

    async def _claim_expired(self) -> None:
        now = _now_ms()
        for rid, (lease, revision) in list(self.leases.items()):
            if rid in self.running or lease.until_ms > now:
                continue
            mine = Lease(self.frontend_id, self._until(), lease.engine_request_id)
            try:
                new_revision = await self._put_lease(rid, mine, revision)
            except Exception:  # another frontend won, or it ended
                continue
            self.leases[rid] = (mine, new_revision)
            log.info("background_response_taking_over", response_id=rid, was=lease.frontend_id)
            await self._take_over(rid, mine, new_revision)

    async def _take_over(self, response_id: str, lease: Lease, revision: int) -> None:
        stored = await self.store.stored_events(response_id)
        skip = len(stored) - 1  # events are numbered from 0 without a gap
        if stored and stored[-1][0] in TERMINAL_EVENTS:  # it ended; only its lease was left
            assert self._kv is not None
            with contextlib.suppress(Exception):
                await self._kv.delete(response_id)
            return
        record = await self.store.get_run(response_id)

        async def work(call: asgi.Call, sink: EventSink) -> None:
            assert self.take_over_work is not None
            await self.take_over_work(response_id, record, call, sink)

        await self.launch(response_id, lease.engine_request_id, work, skip, revision)

    async def continued(self, request: Request) -> TakenOver:
        """The generation of a taken-over response: its attempt in flight stopped, its answer so
        far read back, a new attempt continuing it."""
        await self.cancel_request(request.request_id, "taken_over")
        reader = await answer_so_far(self.store.js, self.store.subjects, request.request_id)
        nxt = next_request(request, reader)
        live = await self.start_request(nxt) if nxt is not None else None
        return TakenOver(request, reader.chunks, live)
