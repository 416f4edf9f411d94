"""A request delivered to a worker after the fleet moved it on (its routers expired the worker
and migrated the request while the delivery waited: a partition, a paused host) is not run: its
token stream already carries a newer attempt, and running it would splice the old attempt's
tokens after the new one's (workers/fence.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from schemas import Request, SamplingParams, Subjects, TokenChunk, decode, encode
from schemas.streams import WORKERS_BUCKET
from tests.support.fleet import Fleet
from tests.support.wait import wait_for


async def test_a_request_delivered_after_it_moved_on_is_not_run(
    nats_url: str, nc: NATS, tmp_path: Path
) -> None:
    fleet = Fleet(nats_url, tmp_path)
    try:
        worker_id = fleet.add_worker()
        s = Subjects(fleet.prefix)
        js = nc.jetstream()

        async def registered() -> bool:
            try:
                kv = await js.key_value(s.bucket_name(WORKERS_BUCKET))
                return bool(await kv.get(worker_id))
            except Exception:
                return False

        await wait_for(registered, 60, 0.2)
        rid = f"late-{uuid.uuid4().hex[:12]}"
        seen: list[TokenChunk] = []

        async def on_chunk(msg: Msg) -> None:
            seen.append(decode(msg.data, TokenChunk))

        await nc.subscribe(s.tok(rid), cb=on_chunk)
        worker = fleet.group.children["worker-0"].proc
        req = Request(rid, "jetfleet-tiny", tuple(b"hello there"), SamplingParams(max_tokens=8))
        os.kill(worker.pid, signal.SIGSTOP)  # its host stops: the delivery waits
        try:
            await js.publish(s.req_worker(req.model, worker_id), encode(req),
                             headers={"Nats-Msg-Id": f"{rid}:0"})  # fmt: skip
            # meanwhile the request moved on: attempt 1 ran elsewhere
            newer = TokenChunk(rid, attempt=1, index=0, token_ids=(65,), worker_id="elsewhere")
            await nc.publish(s.tok(rid), encode(newer))
            await nc.flush()
            await asyncio.sleep(5.0)  # deliberate: older than the worker's 4 s TTL when delivered
        finally:
            os.kill(worker.pid, signal.SIGCONT)

        def decided() -> bool:
            return '"request_fenced"' in fleet.log("worker-0") or any(c.attempt == 0 for c in seen)

        await wait_for(decided, 30, 0.1)
        assert not [c for c in seen if c.attempt == 0], "the old attempt ran and published"
        assert '"request_fenced"' in fleet.log("worker-0")
    finally:
        fleet.stop()
