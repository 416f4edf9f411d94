"""Stored and background responses in JetStream: what any frontend reads, whichever ran them.

``FLEET_RESPONSES`` holds, per response id (subjects ``fleet.resp.{kind}.{id}``):

- ``obj``: the response object, put again at each change of status (the last one is the
  response: ``GET /v1/responses/{id}`` reads it with a direct get of the subject's last message);
- ``in``: its input items (``GET .../input_items``; a continuation replays them);
- ``run``: a background response's ``RunRecord``: what another frontend needs to take it over;
- ``ev``: a background response's stream events, one message each, in order, with
  ``Nats-Msg-Id`` ``{id}:{sequence_number}`` (a frontend that publishes one again is deduped).

Deleting a response purges its subjects. Retention is the stream's (``ResponsesRetention``: age
and bytes, the oldest first; ``jetfleet infra init --responses-max-age-days/--responses-max-gib``).

``responses_running`` (a KV bucket) holds a background response in progress: the frontend
running it and until when its lease holds (``Lease``); ``responses_background.py`` renews,
takes over and ends them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from schemas import Request
from schemas.streams import RUNNING_RESPONSES_BUCKET
from schemas.subjects import Subjects

TERMINAL_EVENTS = frozenset(
    {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}
)
TERMINAL_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})
EVENT_HEADER = "Jf-Event"


class RunRecord(msgspec.Struct, frozen=True):
    """A background response as another frontend takes it over: the body it was created with
    (parsed again for its output settings), its engine request (the prompt, the sampling) and
    the conversation its ``previous_response_id`` resolved to."""

    body: bytes
    request: Request | None  # None until it is sent
    history: list[dict[str, Any]]


class Lease(msgspec.Struct, frozen=True):
    frontend_id: str
    until_ms: int  # wall clock: another frontend may take the response over after this
    engine_request_id: str  # whose token chunks FLEET_TOKENS holds


class ResponsesStore:
    def __init__(self, nc: NATS, subjects: Subjects) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.subjects = subjects
        self.stream = subjects.stream_name("RESPONSES")
        self.bucket = subjects.bucket_name(RUNNING_RESPONSES_BUCKET)

    @property
    def max_value_bytes(self) -> int:
        """The largest object or input list a put can hold (the server's max_payload)."""
        return int(self.nc.max_payload) - 4096

    # ---- objects, inputs, run records
    async def put_object(self, response: dict[str, Any]) -> None:
        await self.js.publish(self.subjects.resp("obj", response["id"]), _json(response))

    async def get_object(self, response_id: str) -> dict[str, Any] | None:
        raw = await self._last("obj", response_id)
        return None if raw is None else dict(json.loads(raw))

    async def put_input(self, response_id: str, items: list[dict[str, Any]]) -> None:
        await self.js.publish(self.subjects.resp("in", response_id), _json(items))

    async def get_input(self, response_id: str) -> list[dict[str, Any]] | None:
        raw = await self._last("in", response_id)
        return None if raw is None else list(json.loads(raw))

    async def put_run(self, response_id: str, run: RunRecord) -> None:
        await self.js.publish(self.subjects.resp("run", response_id), msgspec.msgpack.encode(run))

    async def get_run(self, response_id: str) -> RunRecord | None:
        raw = await self._last("run", response_id)
        return None if raw is None else msgspec.msgpack.decode(raw, type=RunRecord)

    async def cancel_asked(self, response_id: str) -> bool:
        return await self._last("cancel", response_id) is not None

    async def delete(self, response_id: str) -> None:
        await self.js.purge_stream(self.stream, subject=self.subjects.resp_of(response_id))

    async def _last(self, kind: str, response_id: str) -> bytes | None:
        try:
            msg = await self.js.get_last_msg(self.stream, self.subjects.resp(kind, response_id))
        except NotFoundError:
            return None
        return msg.data or b""

    # ---- events
    async def append_event(self, response_id: str, seq: int, kind: str, data: bytes) -> None:
        headers = {"Nats-Msg-Id": f"{response_id}:{seq}", EVENT_HEADER: kind}
        await self.js.publish(self.subjects.resp("ev", response_id), data, headers=headers)

    async def events(self, response_id: str) -> AsyncGenerator[tuple[str, bytes], None]:
        """Every event of the response, from the first, then the new ones as they come, until a
        terminal one: ``(type, data)``."""
        sub = await self.js.subscribe(
            self.subjects.resp("ev", response_id),
            ordered_consumer=True,
            deliver_policy=api.DeliverPolicy.ALL,
        )
        try:
            while True:
                msg = await sub.next_msg(timeout=None)
                kind = (msg.headers or {}).get(EVENT_HEADER, "")
                yield kind, msg.data
                if kind in TERMINAL_EVENTS:
                    return
        finally:
            await sub.unsubscribe()

    async def stored_events(self, response_id: str) -> list[tuple[str, bytes]]:
        """The events stored so far (no waiting for more)."""
        out: list[tuple[str, bytes]] = []
        try:
            info = await self.js.stream_info(
                self.stream, subjects_filter=self.subjects.resp("ev", response_id)
            )
        except NotFoundError:
            return out
        if not info.state.subjects:
            return out
        it = self.events(response_id)
        try:
            total = sum(info.state.subjects.values())
            while len(out) < total:
                out.append(await asyncio.wait_for(anext(it), 10))
        finally:
            await it.aclose()
        return out

    # ---- the running ones
    async def running(self) -> Any:
        return await self.js.key_value(self.bucket)


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
