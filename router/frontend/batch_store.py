"""The Batch API in JetStream: files, batches and each line's answer, read by any frontend.

- a file's content: the ``fleet_files`` object store, under the file's id; its object (name,
  size, purpose): ``fleet.batch.file.{id}`` in ``FLEET_BATCHES`` (the last message);
- a batch's object (status, counts, file ids): ``fleet.batch.obj.{id}``, put at each change;
- each line's answer: one message on ``fleet.batch.out.{id}``, ``Nats-Msg-Id``
  ``{id}:{custom_id}`` (a repeat within the duplicate window is dropped by the server; the output
  file keeps the first answer of each ``custom_id`` whatever came later);
- a cancel: ``fleet.batch.cancel.{id}`` (kept: a frontend taking the batch over sees it);
- the frontend running a batch: its lease in ``batches_running`` (``BatchRunner``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError, ObjectNotFoundError

from schemas.streams import FILES_STORE, RUNNING_BATCHES_BUCKET
from schemas.subjects import Subjects


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


class BatchStore:
    def __init__(self, nc: NATS, subjects: Subjects) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.subjects = subjects
        self.stream = subjects.stream_name("BATCHES")
        self.files_store = subjects.bucket_name(FILES_STORE)
        self.bucket = subjects.bucket_name(RUNNING_BATCHES_BUCKET)

    async def _last(self, kind: str, ident: str) -> bytes | None:
        try:
            msg = await self.js.get_last_msg(self.stream, self.subjects.batch(kind, ident))
        except NotFoundError:
            return None
        return msg.data or b""

    async def _ids(self, kind: str) -> list[str]:
        info = await self.js.stream_info(
            self.stream, subjects_filter=self.subjects.batch_kind_all(kind)
        )
        return [s.rsplit(".", 1)[-1] for s in (info.state.subjects or {})]

    # ---- files
    async def put_file(self, obj: dict[str, Any], content: bytes) -> None:
        store = await self.js.object_store(self.files_store)
        await store.put(obj["id"], content)
        await self.js.publish(self.subjects.batch("file", obj["id"]), _json(obj))

    async def get_file(self, file_id: str) -> dict[str, Any] | None:
        raw = await self._last("file", file_id)
        return None if not raw else dict(json.loads(raw))

    async def file_content(self, file_id: str) -> bytes | None:
        store = await self.js.object_store(self.files_store)
        try:
            result = await store.get(file_id)
        except ObjectNotFoundError:
            return None
        return bytes(result.data or b"")

    async def delete_file(self, file_id: str) -> None:
        store = await self.js.object_store(self.files_store)
        with contextlib.suppress(ObjectNotFoundError):
            await store.delete(file_id)
        await self.js.purge_stream(self.stream, subject=self.subjects.batch("file", file_id))

    async def files(self) -> list[dict[str, Any]]:
        found = [await self.get_file(i) for i in await self._ids("file")]
        return [f for f in found if f is not None]

    # ---- batches
    async def put_batch(self, obj: dict[str, Any]) -> None:
        await self.js.publish(self.subjects.batch("obj", obj["id"]), _json(obj))

    async def get_batch(self, batch_id: str) -> dict[str, Any] | None:
        raw = await self._last("obj", batch_id)
        return None if not raw else dict(json.loads(raw))

    async def batches(self) -> list[dict[str, Any]]:
        found = [await self.get_batch(i) for i in await self._ids("obj")]
        return [b for b in found if b is not None]

    async def put_result(self, batch_id: str, result: dict[str, Any]) -> None:
        headers = {"Nats-Msg-Id": f"{batch_id}:{result['custom_id']}"}
        await self.js.publish(self.subjects.batch("out", batch_id), _json(result), headers=headers)

    async def results(self, batch_id: str) -> list[dict[str, Any]]:
        """Every answer stored for the batch, in order."""
        subject = self.subjects.batch("out", batch_id)
        info = await self.js.stream_info(self.stream, subjects_filter=subject)
        total = sum((info.state.subjects or {}).values())
        out: list[dict[str, Any]] = []
        if total == 0:
            return out
        sub = await self.js.subscribe(
            subject, stream=self.stream, ordered_consumer=True, deliver_policy=api.DeliverPolicy.ALL
        )
        try:
            while len(out) < total:
                msg = await asyncio.wait_for(sub.next_msg(timeout=None), 10)
                out.append(json.loads(msg.data))
        finally:
            await sub.unsubscribe()
        return out

    async def ask_cancel(self, batch_id: str) -> None:
        await self.js.publish(self.subjects.batch("cancel", batch_id), b"")

    async def cancel_asked(self, batch_id: str) -> bool:
        return await self._last("cancel", batch_id) is not None

    async def running(self) -> Any:
        return await self.js.key_value(self.bucket)
