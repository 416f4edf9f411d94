"""The Batch API: ``/v1/files`` and ``/v1/batches``, run by the frontends, kept in JetStream.

``POST /v1/files`` (multipart, ``purpose`` ``batch``) keeps a JSONL file (at most
``max_file_mb``); ``POST /v1/batches`` validates it (``batch_lines.validate``: a bad file fails
the batch, naming its lines) and runs it on the frontend that took it, under a lease
(``batches_running``) that the frontend renews: its lines go through the same endpoints as HTTP
requests (chat completions, completions, embeddings, responses), at most ``concurrency`` in
flight on the frontend, fewer while the interactive requests slow down (``batch_pace.py``), at
``priority`` 1 (after interactive requests, on engines that schedule by priority); each answer is
stored as it comes (``batch_store.py``). A line the API refuses is a line of the error file with
its status and error object, not a failed batch. When the frontend dies, another takes the batch
over once the lease has run out and runs the lines that have no answer yet; when all have one,
the output and error files are written (each ``custom_id`` once) and the batch is ``completed``.
``POST /v1/batches/{id}/cancel`` stops it (``cancelling``, then ``cancelled`` with the files of
what was answered).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import msgspec
import structlog
from nats.js.kv import KeyValue

from router.frontend import asgi
from router.frontend.batch_lines import (
    ENDPOINTS,
    TERMINAL,
    Line,
    answered_ok,
    batch_object,
    expired_line,
    file_object,
    first_answers,
    multipart_form,
    new_id,
    result_line,
    split_results,
    validate,
)
from router.frontend.batch_pace import BatchPace
from router.frontend.batch_store import BatchStore
from router.frontend.errors import OpenAIError
from router.frontend.leases import follow_leases
from router.frontend.shapes import encode

log = structlog.get_logger("jetfleet.batches")

BATCH_PRIORITY = 1
LINE_TRIES = 4  # a line answered 5xx is sent again this many times in all
LEASE_S = 10.0
WINDOW_S = 24 * 3600.0  # OpenAI's completion window ("24h", the only one it takes)
CHECK_S = 1.0
COUNTS_EVERY_S = 0.5  # the batch object's request_counts are put at most this often
PACE_WINDOW_S = 1.0  # the pace's window
LAG_EVERY_S = 0.05  # the event loop's lag is sampled this often

# (call) -> None: an HTTP request through the frontend's own routes (errors as their JSON)
Dispatch = Callable[[asgi.Call], Awaitable[None]]


class Lease(msgspec.Struct, frozen=True):
    frontend_id: str
    until_ms: int


def _now_ms() -> int:
    return int(time.time() * 1000)


def _bad(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, message, param=param)


def _not_found(kind: str, ident: str) -> OpenAIError:
    return OpenAIError(404, f"No {kind} with id '{ident}' found.", type="not_found_error")


async def _line_call(
    dispatch: Dispatch, endpoint: str, body: bytes, request_id: str
) -> tuple[int, Any]:
    """Run one request through the frontend's routes, as HTTP would: (status, JSON body)."""
    sent: list[bytes] = []
    status = [0]
    given = [False]
    forever = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if not given[0]:
            given[0] = True
            return {"type": "http.request", "body": body, "more_body": False}
        await forever.wait()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status[0] = int(message["status"])
        else:
            sent.append(message.get("body", b""))

    scope: asgi.Scope = {
        "type": "http",
        "path": endpoint,
        "method": "POST",
        "headers": [(b"content-type", b"application/json")],
    }
    ctx: dict[str, Any] = {"request_id": request_id, "priority": BATCH_PRIORITY, "batch": True}
    call = asgi.Call(scope, receive, send, ctx, "", time.monotonic(), 32.0)
    await dispatch(call)
    raw = b"".join(sent)
    try:
        return status[0], json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return status[0], {"error": {"message": raw.decode(errors="replace")}}


@dataclass
class _Running:
    task: asyncio.Task[None]
    revision: int
    stop: asyncio.Event = field(default_factory=asyncio.Event)  # no new line starts
    cancelled: bool = False  # stopped by a cancel (else: handed over)
    expired: bool = False  # stopped at the end of its completion window


@dataclass
class BatchService:
    store: BatchStore
    frontend_id: str
    dispatch: Dispatch
    concurrency: int = 16
    max_file_mb: float = 100.0
    lease_s: float = LEASE_S
    pace: BatchPace | None = None  # None: always ``concurrency`` lines in flight
    window_s: float = WINDOW_S  # the completion window: expired this long after creation
    in_flight: int = 0  # lines in flight, all batches on this frontend
    _room: asyncio.Event = field(default_factory=asyncio.Event)
    _busy_from: float = 0.0  # monotonic: more than the pace's quiet lines in flight since
    _busy_until: float = 0.0  # monotonic: when the last such stretch ended
    running: dict[str, _Running] = field(default_factory=dict)
    leases: dict[str, tuple[Lease, int]] = field(default_factory=dict)
    _kv: KeyValue | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self) -> None:
        self._kv = await self.store.running()
        self._tasks = [
            asyncio.create_task(self._watch(), name="batch-leases"),
            asyncio.create_task(self._keep(), name="batch-keeper"),
        ]
        if self.pace is not None:
            self._tasks.append(asyncio.create_task(self._follow_pace(), name="batch-pace"))
        await self.store.nc.subscribe(
            self.store.subjects.batch_kind_all("cancel"), cb=self._on_cancel
        )

    async def stop(self) -> None:
        """Stop the batches here and give their leases up (another frontend goes on at once)."""
        for t in self._tasks:
            t.cancel()
        stopping = list(self.running.items())
        for _bid, run in stopping:
            run.stop.set()
            run.task.cancel()
        for bid, run in stopping:
            with contextlib.suppress(BaseException):
                await run.task
            with contextlib.suppress(Exception):
                await self._put_lease(bid, Lease(self.frontend_id, 0), run.revision)

    # ---- /v1/files
    async def files(self, call: asgi.Call) -> None:
        path, method = call.scope["path"], call.scope["method"]
        rest = path.removeprefix("/v1/files").strip("/").split("/") if path != "/v1/files" else []
        if not rest:
            if method == "POST":
                await self._upload(call)
            elif method == "GET":
                listed = sorted(await self.store.files(), key=lambda f: -f["created_at"])
                await asgi.send_json(call.send, 200, encode({"object": "list", "data": listed}))
            else:
                raise OpenAIError(405, f"Method {method} not allowed on {path}")
            return
        file_id = rest[0]
        if not _safe(file_id) or len(rest) > 2 or (len(rest) == 2 and rest[1] != "content"):
            raise OpenAIError(404, f"Unknown path {path}", type="not_found_error")
        obj = await self.store.get_file(file_id)
        if obj is None:
            raise _not_found("file", file_id)
        if len(rest) == 2 and method == "GET":
            content = await self.store.file_content(file_id)
            if content is None:
                raise _not_found("file", file_id)
            await asgi.send_text(call.send, 200, content, b"application/octet-stream")
        elif method == "GET":
            await asgi.send_json(call.send, 200, encode(obj))
        elif method == "DELETE" and len(rest) == 1:
            await self.store.delete_file(file_id)
            body = {"id": file_id, "object": "file", "deleted": True}
            await asgi.send_json(call.send, 200, encode(body))
        else:
            raise OpenAIError(405, f"Method {method} not allowed on {path}")

    async def _upload(self, call: asgi.Call) -> None:
        limit = int(self.max_file_mb * (1 << 20))
        try:
            body = await asgi.read_body(call.receive, limit + (1 << 20))
        except asgi.BodyTooLarge:
            raise OpenAIError(
                413, f"File larger than {self.max_file_mb:g} MiB", code="file_too_large"
            ) from None
        ctype = next((v.decode() for k, v in call.scope["headers"] if k == b"content-type"), "")
        if not ctype.startswith("multipart/form-data"):
            raise _bad("file", "upload a file as multipart/form-data (fields file and purpose)")
        form = await asyncio.to_thread(multipart_form, ctype, body)  # off the event loop
        purpose = form.get("purpose", (None, b""))[1].decode()
        if purpose != "batch":
            raise _bad("purpose", "purpose must be 'batch' (the files this server keeps)")
        if "file" not in form:
            raise _bad("file", "Missing required parameter: 'file'.")
        filename, content = form["file"]
        if len(content) > limit:
            raise OpenAIError(
                413, f"File larger than {self.max_file_mb:g} MiB", code="file_too_large"
            )
        obj = file_object(new_id("file-"), filename or "upload.jsonl", len(content), purpose)
        await self.store.put_file(obj, content)
        await asgi.send_json(call.send, 200, encode(obj))

    # ---- /v1/batches
    async def batches(self, call: asgi.Call) -> None:
        path, method = call.scope["path"], call.scope["method"]
        rest = [p for p in path.removeprefix("/v1/batches").split("/") if p]
        if not rest:
            if method == "POST":
                await self._create(call)
            elif method == "GET":
                await self._list(call)
            else:
                raise OpenAIError(405, f"Method {method} not allowed on {path}")
            return
        batch_id = rest[0]
        if not _safe(batch_id) or len(rest) > 2 or (len(rest) == 2 and rest[1] != "cancel"):
            raise OpenAIError(404, f"Unknown path {path}", type="not_found_error")
        obj = await self.store.get_batch(batch_id)
        if obj is None:
            raise _not_found("batch", batch_id)
        if len(rest) == 1 and method == "GET":
            await asgi.send_json(call.send, 200, encode(obj))
        elif len(rest) == 2 and method == "POST":
            await asgi.send_json(call.send, 200, encode(await self._cancel(obj)))
        else:
            raise OpenAIError(405, f"Method {method} not allowed on {path}")

    async def _list(self, call: asgi.Call) -> None:
        query = {
            k: v[-1] for k, v in parse_qs(call.scope.get("query_string", b"").decode()).items()
        }
        try:
            limit = int(query.get("limit", "20"))
        except ValueError:
            raise _bad("limit", "limit must be an integer") from None
        every = sorted(await self.store.batches(), key=lambda b: (-b["created_at"], b["id"]))
        after = query.get("after")
        if after is not None:
            ids = [b["id"] for b in every]
            every = every[ids.index(after) + 1 :] if after in ids else []
        data = every[:limit]
        body = {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": len(every) > limit,
        }
        await asgi.send_json(call.send, 200, encode(body))

    async def _create(self, call: asgi.Call) -> None:
        try:
            req = json.loads(await call.body())
        except json.JSONDecodeError:
            raise _bad("body", "the body is not JSON") from None
        if not isinstance(req, dict):
            raise _bad("body", "the body must be a JSON object")
        endpoint = req.get("endpoint")
        if endpoint not in ENDPOINTS:
            raise _bad("endpoint", f"endpoint must be one of {', '.join(ENDPOINTS)}")
        if req.get("completion_window", "24h") != "24h":
            raise _bad("completion_window", "completion_window must be '24h'")
        file_id = req.get("input_file_id")
        if not isinstance(file_id, str) or await self.store.get_file(file_id) is None:
            raise _not_found("file", str(file_id))
        content = await self.store.file_content(file_id) or b""
        lines, errors = await asyncio.to_thread(validate, content, endpoint)
        obj = batch_object(
            new_id("batch_"), endpoint, file_id, "24h", req.get("metadata"), len(lines),
            window_s=int(self.window_s),
        )  # fmt: skip
        if errors:
            obj |= {
                "status": "failed",
                "failed_at": int(time.time()),
                "errors": {"object": "list", "data": errors},
            }
            obj["request_counts"]["total"] = 0
            await self.store.put_batch(obj)
            await asgi.send_json(call.send, 200, encode(obj))
            return
        obj |= {"status": "in_progress", "in_progress_at": int(time.time())}
        await self.store.put_batch(obj)
        assert self._kv is not None
        revision = await self._kv.create(
            obj["id"], msgspec.msgpack.encode(Lease(self.frontend_id, self._until()))
        )
        self._launch(obj["id"], revision)
        await asgi.send_json(call.send, 200, encode(obj))

    async def _cancel(self, obj: dict[str, Any]) -> dict[str, Any]:
        if obj["status"] in TERMINAL or obj["status"] == "cancelling":
            return obj
        obj = obj | {"status": "cancelling", "cancelling_at": int(time.time())}
        await self.store.put_batch(obj)
        await self.store.ask_cancel(obj["id"])
        return obj

    async def _on_cancel(self, msg: Any) -> None:
        run = self.running.get(msg.subject.rsplit(".", 1)[-1])
        if run is not None:
            run.cancelled = True
            run.stop.set()
            run.task.cancel()  # the lines in flight stop (their workers abort)

    # ---- running one
    def _launch(self, batch_id: str, revision: int) -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(self._execute(batch_id, stop), name=f"batch-{batch_id}")
        self.running[batch_id] = _Running(task, revision, stop)

    async def _execute(self, batch_id: str, stop: asyncio.Event) -> None:
        try:
            await self._run_lines(batch_id, stop)
        except asyncio.CancelledError:
            asgi.settle_cancellation()
        except Exception:
            log.exception("batch_failed", batch_id=batch_id)
            self.running.pop(batch_id, None)
            return
        run = self.running.pop(batch_id, None)
        cancelled = run is not None and run.cancelled
        expired = run is not None and run.expired
        if stop.is_set() and not (cancelled or expired):
            return  # handed over: another frontend goes on
        if cancelled or await self.store.cancel_asked(batch_id):
            end = "cancelled"
        else:
            end = "expired" if expired else "completed"
        with contextlib.suppress(Exception):
            await self._finish(batch_id, end)
        if self._kv is not None:
            with contextlib.suppress(Exception):
                await self._kv.delete(batch_id)

    def _expire(self, batch_id: str) -> None:
        """The batch's completion window ended: stop it; its end is ``expired``."""
        run = self.running.get(batch_id)
        if run is not None and not run.cancelled:
            log.info("batch_expired", batch_id=batch_id)
            run.expired = True
            run.stop.set()
            run.task.cancel()  # the lines in flight stop (their workers abort)

    async def _run_lines(self, batch_id: str, stop: asyncio.Event) -> None:
        obj = await self.store.get_batch(batch_id)
        if obj is None or obj["status"] in TERMINAL:
            return
        if await self.store.cancel_asked(batch_id):
            return
        left = obj["expires_at"] - time.time()
        timer = asyncio.get_running_loop().call_later(max(left, 0.0), self._expire, batch_id)
        try:
            await self._run_todo(batch_id, obj, stop)
        finally:
            timer.cancel()

    async def _run_todo(self, batch_id: str, obj: dict[str, Any], stop: asyncio.Event) -> None:
        content = await self.store.file_content(obj["input_file_id"]) or b""
        lines, _ = await asyncio.to_thread(validate, content, obj["endpoint"])
        firsts = first_answers(await self.store.results(batch_id))  # read once, at the start
        answered = {r["custom_id"] for r in firsts}
        ok = sum(map(answered_ok, firsts))
        total = obj.get("request_counts", {}).get("total", 0)
        counts = {"total": total, "completed": ok, "failed": len(firsts) - ok}
        todo = [line for line in lines if line.custom_id not in answered]
        log.info("batch_running", batch_id=batch_id, lines=len(lines), todo=len(todo))
        queue: asyncio.Queue[Line] = asyncio.Queue()
        for line in todo:
            queue.put_nowait(line)
        last_put = [time.monotonic()]

        async def worker() -> None:
            while not queue.empty() and not stop.is_set():
                if not await self._take_room(stop):
                    return
                try:
                    if queue.empty():
                        return
                    line = queue.get_nowait()
                    result = await self._answer(obj["endpoint"], line)
                finally:
                    self._give_room()
                if stop.is_set() and result["response"]["status_code"] == 0:
                    return  # stopped in flight: no answer (a taker runs it again)
                await self.store.put_result(batch_id, result)
                ok = 200 <= result["response"]["status_code"] < 300
                counts["completed" if ok else "failed"] += 1
                if time.monotonic() - last_put[0] >= COUNTS_EVERY_S:
                    last_put[0] = time.monotonic()
                    await self.store.put_batch(obj | {"request_counts": dict(counts)})

        await asyncio.gather(*(worker() for _ in range(min(self.concurrency, len(todo)) or 1)))

    def _limit(self) -> int:
        return min(self.pace.lines, self.concurrency) if self.pace else self.concurrency

    async def _take_room(self, stop: asyncio.Event) -> bool:
        """A place for one more line in flight (False: the batch stopped meanwhile)."""
        while self.in_flight >= self._limit():
            if stop.is_set():
                return False
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), CHECK_S)
        if stop.is_set():
            return False
        self.in_flight += 1
        if self.pace is not None and self.in_flight == self.pace.quiet_lines + 1:
            self._busy_from = time.monotonic()
        return True

    def _give_room(self) -> None:
        self.in_flight -= 1
        self._room.set()
        if self.pace is not None and self.in_flight == self.pace.quiet_lines:
            self._busy_until = time.monotonic()

    def interactive_ttft(self, accepted: float, first_at: float) -> None:
        """An interactive request's first token (monotonic times), for the pace: quiet when no
        more than the pace's quiet lines were in flight from ``accepted`` to ``first_at``."""
        if self.pace is None:
            return
        busy_now = self.in_flight > self.pace.quiet_lines
        quiet = self._busy_until < accepted and (not busy_now or self._busy_from > first_at)
        self.pace.ttft(first_at - accepted, quiet)

    async def _follow_pace(self) -> None:
        """Sample the event loop's lag; once a window, let the pace set the lines in flight."""
        assert self.pace is not None
        loop = asyncio.get_running_loop()
        window_ends = loop.time() + PACE_WINDOW_S
        while True:
            before = loop.time()
            await asyncio.sleep(LAG_EVERY_S)
            now = loop.time()
            self.pace.lag((now - before - LAG_EVERY_S) * 1000)
            if now >= window_ends:
                window_ends = now + PACE_WINDOW_S
                self.pace.window()
                self._room.set()

    async def _answer(self, endpoint: str, line: Line) -> dict[str, Any]:
        request_id = new_id("")
        if line.body.get("stream"):
            message = "stream is not supported in a batch"
            error = {"error": {"message": message, "type": "invalid_request_error"}}
            return result_line(line.custom_id, 400, error, request_id)
        body = json.dumps(line.body).encode()
        for attempt in range(LINE_TRIES):  # a 5xx (a worker killed, no worker yet) is retried
            status, answer = await _line_call(self.dispatch, endpoint, body, request_id)
            if status < 500 or attempt == LINE_TRIES - 1:
                break
            await asyncio.sleep(0.5 * (attempt + 1))
        return result_line(line.custom_id, status, answer, request_id)

    async def _finish(self, batch_id: str, end: str) -> None:
        """Write the output and error files and end the batch ``end`` (completed, cancelled,
        expired: then each line without an answer is a ``batch_expired`` line of the error
        file, as in OpenAI's API)."""
        obj = await self.store.get_batch(batch_id)
        if obj is None or obj["status"] in TERMINAL:
            return
        now = int(time.time())
        obj = obj | {"status": "finalizing", "finalizing_at": now}
        await self.store.put_batch(obj)
        results = await self.store.results(batch_id)
        if end == "expired":
            results += await self._unanswered(obj, {r["custom_id"] for r in results})
        out, err, ok, failed = await asyncio.to_thread(split_results, results)
        files: dict[str, str | None] = {"output_file_id": None, "error_file_id": None}
        for key, content, name in (
            ("output_file_id", out, f"{batch_id}_output.jsonl"),
            ("error_file_id", err, f"{batch_id}_error.jsonl"),
        ):
            if content:
                f = file_object(new_id("file-"), name, len(content), "batch_output")
                await self.store.put_file(f, content)
                files[key] = f["id"]
        counts = {"total": obj["request_counts"]["total"], "completed": ok, "failed": failed}
        ended = {"status": end, f"{end}_at": now}
        await self.store.put_batch(obj | files | ended | {"request_counts": counts})
        log.info("batch_finished", batch_id=batch_id, completed=ok, failed=failed, **ended)

    async def _unanswered(self, obj: dict[str, Any], answered: set[str]) -> list[dict[str, Any]]:
        content = await self.store.file_content(obj["input_file_id"]) or b""
        lines, _ = await asyncio.to_thread(validate, content, obj["endpoint"])
        return [expired_line(line.custom_id) for line in lines if line.custom_id not in answered]

    # ---- leases
    def _until(self) -> int:
        return _now_ms() + int(self.lease_s * 1000)

    async def _put_lease(self, batch_id: str, lease: Lease, revision: int) -> int:
        assert self._kv is not None
        return int(await self._kv.update(batch_id, msgspec.msgpack.encode(lease), revision))

    async def _watch(self) -> None:
        assert self._kv is not None
        await follow_leases(self._kv, Lease, self.leases)

    async def _keep(self) -> None:
        last_renew = 0.0
        while True:
            await asyncio.sleep(CHECK_S)
            if time.monotonic() - last_renew >= self.lease_s / 3:
                last_renew = time.monotonic()
                for bid, run in list(self.running.items()):
                    try:
                        run.revision = await self._put_lease(
                            bid, Lease(self.frontend_id, self._until()), run.revision
                        )
                    except Exception as exc:  # taken over: let it go here
                        log.warning("batch_lease_lost", batch_id=bid, error=str(exc))
                        run.stop.set()
                        run.task.cancel()
            now = _now_ms()
            for bid, (held, revision) in list(self.leases.items()):
                if bid in self.running or held.until_ms > now:
                    continue
                try:
                    mine = await self._put_lease(
                        bid, Lease(self.frontend_id, self._until()), revision
                    )
                except Exception:
                    continue  # another frontend won
                log.info("batch_taking_over", batch_id=bid, was=held.frontend_id)
                self._launch(bid, mine)


def _safe(ident: str) -> bool:
    return 0 < len(ident) <= 128 and all(c.isalnum() or c in "_-" for c in ident)
