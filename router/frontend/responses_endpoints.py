"""The Responses endpoints: ``POST /v1/responses`` and the stored responses under
``/v1/responses/{id}``.

Responses are stored (``store``, default true as in OpenAI's API; ``false`` leaves nothing) in
JetStream (``responses_store.py``), so any frontend answers ``GET /v1/responses/{id}``,
``GET .../input_items``, ``DELETE``, and continues one named by ``previous_response_id`` (its
conversation replayed before the new input: ``responses_items.py``). ``background: true``
answers at once (``queued``) and runs the response with no client attached
(``responses_background.py``): ``GET`` shows its progress, ``POST .../cancel`` stops it, and with
``stream: true`` its events can be read again from any frontend, ``GET
/v1/responses/{id}?stream=true&starting_after=N`` (after the event N; the stream ends with the
response, at once when it has ended and nothing is after N).

A foreground response is stored before its last byte goes out (a ``retrieve`` right after
``create`` finds it); one that failed is not stored. The request and its conversation must fit
one stored message (the NATS server's ``max_payload``, 1 MiB by default): a larger one is a 400
that says to send it with ``store: false``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import msgspec

from router.frontend import asgi
from router.frontend.errors import OpenAIError
from router.frontend.openai_protocol import ChatCompletionRequest, check_chat_request
from router.frontend.params import chat_generation_params, checked_chat
from router.frontend.responses_api import (
    ResponsesRequest,
    parse_responses_request,
    to_chat_request,
)
from router.frontend.responses_background import BackgroundRunner, EventSink
from router.frontend.responses_items import (
    MAX_CHAIN,
    conversation,
    input_items,
    new_response_id,
    page,
)
from router.frontend.responses_shape import ResponsesShape
from router.frontend.responses_store import TERMINAL_STATUSES, ResponsesStore, RunRecord
from router.frontend.serving import Endpoint, Serving
from router.frontend.shapes import encode
from schemas import Request

ENDPOINT = Endpoint("responses", "resp", chat=True)
CANCEL_WAIT_S = 15.0  # a cancel answers once the response has stopped, or after this


def _bad(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, message, param=param)


def _not_found(response_id: str) -> OpenAIError:
    return OpenAIError(404, f"Response with id '{response_id}' not found.", type="not_found_error")


@dataclass
class Responses:
    """What the Responses endpoints serve with: the generation path, the store, the runner of
    background responses (which calls back ``take_over`` for one another frontend started)."""

    serving: Serving
    store: ResponsesStore
    runner: BackgroundRunner

    def __post_init__(self) -> None:
        self.runner.take_over_work = self.take_over

    # ---- POST /v1/responses
    async def create(self, call: asgi.Call) -> None:
        body = await call.body()
        original = parse_responses_request(body)
        history = await self._history(original.previous_response_id)
        creq, params = checked_chat(to_chat_request(original, history))
        stored = original.store is not False
        if original.background and not stored:
            raise _bad("background", "background responses must be stored (store: true)")
        response_id = new_response_id()
        items = input_items(original.input, response_id)
        if stored and len(body) + len(encode(history)) > self.store.max_value_bytes:
            raise _bad(
                "input",
                f"the input is too large to store (at most {self.store.max_value_bytes} "
                "bytes with its conversation): send it with store: false",
            )
        created = int(time.time())
        if original.background:
            await self._background(call, body, original, creq, history, response_id, items)
            return
        shapes: list[ResponsesShape] = []

        def shape_for(_rid: str, _prompt_len: int) -> ResponsesShape:
            shapes.append(ResponsesShape(response_id, created, creq.model, original, stored))
            return shapes[-1]

        if stored:
            call.send = self._storing(call.send, shapes, response_id, items)
        await self.serving.generate(call, ENDPOINT, creq, params, shape_for, len(body))

    def _storing(
        self,
        send: asgi.Send,
        shapes: list[ResponsesShape],
        response_id: str,
        items: list[dict[str, Any]],
    ) -> asgi.Send:
        """``send``, storing the response before its last byte goes out."""

        async def store_then_send(message: dict[str, Any]) -> None:
            last = message["type"] == "http.response.body" and not message.get("more_body")
            if last and shapes and shapes[-1].final is not None:
                await self.store.put_input(response_id, items)
                await self.store.put_object(shapes[-1].final)
            await send(message)

        return store_then_send

    async def _background(
        self,
        call: asgi.Call,
        body: bytes,
        original: ResponsesRequest,
        creq: ChatCompletionRequest,
        history: list[dict[str, Any]],
        response_id: str,
        items: list[dict[str, Any]],
    ) -> None:
        shape = ResponsesShape(response_id, int(time.time()), creq.model, original, True)
        queued = shape.snapshot("queued")
        await self.store.put_input(response_id, items)
        await self.store.put_run(response_id, RunRecord(body, None, history))
        await self.store.put_object(queued)

        async def work(bcall: asgi.Call, _sink: EventSink) -> None:
            await self._run(bcall, response_id, body, original, history, queued["created_at"])

        engine_request_id = f"{ENDPOINT.id_prefix}-{response_id.removeprefix('resp_')}"
        await self.runner.launch(response_id, engine_request_id, work)
        if original.stream:
            await stream_events(call, self.store, response_id, -1)
        else:
            await asgi.send_json(call.send, 200, encode(queued))

    async def _run(
        self,
        call: asgi.Call,
        response_id: str,
        body: bytes,
        original: ResponsesRequest,
        history: list[dict[str, Any]],
        created: int,
    ) -> None:
        """A background response from its start (streamed: its events are what is kept)."""
        creq = check_chat_request(to_chat_request(original, history))
        creq = msgspec.structs.replace(creq, stream=True)

        async def keep(requests: list[Request]) -> None:  # what a taker-over needs
            await self.store.put_run(response_id, RunRecord(body, requests[0], history))

        def shape_for(_rid: str, _prompt_len: int) -> ResponsesShape:
            return ResponsesShape(response_id, created, creq.model, original, True)

        params = chat_generation_params(creq)
        await self.serving.generate(call, ENDPOINT, creq, params, shape_for, len(body), keep)

    async def take_over(
        self, response_id: str, record: RunRecord | None, call: asgi.Call, sink: EventSink
    ) -> None:
        """Run on a background response another frontend started (``BackgroundRunner``)."""
        if record is not None and await self.store.cancel_asked(response_id):
            if record.request is not None:
                await self.runner.cancel_request(record.request.request_id, "cancelled")
            await sink.end("cancelled", None)
            return
        obj = await self.store.get_object(response_id) or {}
        created = int(obj.get("created_at") or time.time())
        if record is None:
            raise OpenAIError(500, "the background response's request was not stored")
        original = parse_responses_request(record.body)
        if record.request is None:  # its first frontend died before sending it: from the start
            await self._run(call, response_id, record.body, original, record.history, created)
            return
        creq = check_chat_request(to_chat_request(original, record.history))
        creq = msgspec.structs.replace(creq, stream=True)
        gen = await self.runner.continued(record.request)
        shape = ResponsesShape(response_id, created, creq.model, original, True)
        await self.serving.resume(call, ENDPOINT, creq, chat_generation_params(creq), shape, gen)

    async def _history(self, previous: str | None) -> list[dict[str, Any]]:
        """The conversation ``previous`` ends, oldest first."""
        chain: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []
        while previous and len(chain) < MAX_CHAIN:
            obj = await self.store.get_object(previous)
            if obj is None:
                raise OpenAIError(
                    404,
                    f"Previous response with id '{previous}' not found.",
                    type="not_found_error",
                    param="previous_response_id",
                )
            if obj.get("status") not in ("completed", "incomplete"):
                raise _bad(
                    "previous_response_id",
                    f"Previous response '{previous}' is {obj.get('status')}: a conversation "
                    "continues a finished response",
                )
            chain.append((await self.store.get_input(previous) or [], obj))
            previous = obj.get("previous_response_id")
        return conversation(list(reversed(chain)))

    # ---- /v1/responses/{id}[/input_items|/cancel]
    async def stored(self, call: asgi.Call) -> None:
        parts = call.scope["path"].removeprefix("/v1/responses/").split("/")
        method = call.scope["method"]
        response_id, rest = parts[0], parts[1:]
        if not response_id or not _safe(response_id) or len(rest) > 1:
            raise OpenAIError(404, f"Unknown path {call.scope['path']}", type="not_found_error")
        query = {
            k: v[-1] for k, v in parse_qs(call.scope.get("query_string", b"").decode()).items()
        }
        if not rest and method == "GET":
            await self._retrieve(call, response_id, query)
        elif not rest and method == "DELETE":
            await self._delete(call, response_id)
        elif rest == ["input_items"] and method == "GET":
            await self._input_items(call, response_id, query)
        elif rest == ["cancel"] and method == "POST":
            await self._cancel(call, response_id)
        elif rest in ([], ["input_items"], ["cancel"]):
            raise OpenAIError(405, f"Method {method} not allowed on {call.scope['path']}")
        else:
            raise OpenAIError(404, f"Unknown path {call.scope['path']}", type="not_found_error")

    async def _object(self, response_id: str) -> dict[str, Any]:
        obj = await self.store.get_object(response_id)
        if obj is None:
            raise _not_found(response_id)
        return obj

    async def _retrieve(self, call: asgi.Call, response_id: str, query: dict[str, str]) -> None:
        obj = await self._object(response_id)
        if query.get("stream", "false").lower() != "true":
            await asgi.send_json(call.send, 200, encode(obj))
            return
        if not obj.get("background"):
            raise _bad("stream", "only a background response can be streamed again")
        after = _int(query.get("starting_after", "-1"), "starting_after")
        await stream_events(call, self.store, response_id, after)

    async def _delete(self, call: asgi.Call, response_id: str) -> None:
        obj = await self._object(response_id)
        if obj.get("status") not in TERMINAL_STATUSES and obj.get("background"):
            await self.runner.cancel(response_id)
        await self.store.delete(response_id)
        body = {"id": response_id, "object": "response", "deleted": True}
        await asgi.send_json(call.send, 200, encode(body))

    async def _input_items(self, call: asgi.Call, response_id: str, query: dict[str, str]) -> None:
        await self._object(response_id)
        items = await self.store.get_input(response_id) or []
        limit = _int(query.get("limit", "20"), "limit")
        if not 1 <= limit <= 100:
            raise _bad("limit", "limit must be between 1 and 100")
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise _bad("order", "order must be asc or desc")
        listed = page(items, limit, order, query.get("after"))
        await asgi.send_json(call.send, 200, encode(listed))

    async def _cancel(self, call: asgi.Call, response_id: str) -> None:
        obj = await self._object(response_id)
        if not obj.get("background"):
            raise _bad(
                "response_id", "Only responses created with background=true can be cancelled."
            )
        status = obj.get("status")
        if status == "cancelled":
            await asgi.send_json(call.send, 200, encode(obj))
            return
        if status in TERMINAL_STATUSES:
            raise _bad("response_id", f"Cannot cancel a {status} response.")
        await self.runner.cancel(response_id)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline:  # the frontend running it ends it, or a taker does
            obj = await self._object(response_id)
            if obj.get("status") in TERMINAL_STATUSES:
                break
            await asyncio.sleep(0.05)
        await asgi.send_json(call.send, 200, encode(obj))


async def stream_events(
    call: asgi.Call, store: ResponsesStore, response_id: str, after: int
) -> None:
    """A background response's events after ``after``, from the store, then as they come,
    until it ends."""
    await asgi.start_sse(call.send)
    try:
        async with asgi.DisconnectWatcher(call.receive):
            async for kind, data in store.events(response_id):
                if json.loads(data)["sequence_number"] > after:
                    event = b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"
                    await asgi.send_sse(call.send, event)
    except asyncio.CancelledError:  # the client left
        asgi.settle_cancellation()
        return
    await asgi.end_sse(call.send)


def _safe(response_id: str) -> bool:
    return len(response_id) <= 128 and all(c.isalnum() or c in "_-" for c in response_id)


def _int(value: str, param: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise _bad(param, f"{param} must be an integer") from None
