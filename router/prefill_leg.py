"""A remote prefill, the leg a disaggregated request runs before its first attempt
(``router/client.py`` starts it, ``Generation`` awaits it).

The prefill request (``{id}-prefill``: ``max_tokens=1``, ``min_tokens=1``,
``kv_transfer_params={"do_remote_decode": true}``) runs on a prefill worker like any request,
but is never migrated (one attempt, ``prefill_timeout_s`` as its stall timeout). Its answer is
the final chunk's ``kv_transfer_params``, which the decode attempt carries so that its worker
pulls the prompt's KV. A prefill that fails, stalls past the timeout or answers without transfer
parameters gives no answer: the decode worker prefills itself (``disagg`` ``local`` with the
reason). The prefill worker frees the blocks it held when the decode worker confirms the pull,
or when the frontend says none will come (``release``), or after its own hold timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Protocol

import msgspec
import structlog

from schemas import Request, TokenChunk
from schemas.requests import prefill_request_id

log = structlog.get_logger("jetfleet.disagg")


class PrefillRun(Protocol):
    """The prefill's own generation (a ``Generation`` on the prefill leg)."""

    worker_id: str

    def __aiter__(self) -> AsyncIterator[TokenChunk]: ...

    async def cancel(self, reason: str = ..., stop_worker: bool = ...) -> None: ...


class Releaser(Protocol):
    async def release_prefill(self, worker_id: str, request_id: str) -> None: ...


def prefill_request(request: Request) -> Request:
    """The prefill leg's request for ``request``."""
    sampling = msgspec.structs.replace(request.sampling, max_tokens=1, min_tokens=1)
    return msgspec.structs.replace(
        request,
        request_id=prefill_request_id(request.request_id),
        sampling=sampling,
        kv_transfer_params={"do_remote_decode": True},
        route=None,
    )


class PrefillLeg:
    def __init__(
        self, gen: PrefillRun, timeout_s: float, accepted: float, releaser: Releaser
    ) -> None:
        self.gen: PrefillRun | None = gen  # while it runs
        self.timeout_s = timeout_s
        self.accepted = accepted
        self.releaser = releaser
        self.worker_id = ""
        self.seconds = 0.0  # accepted to the answer
        self.failure = ""  # why there is no answer ("" : there is one, or not yet)

    async def answer(self, request_id: str) -> TokenChunk | None:
        """The prefill's final chunk (with its transfer parameters), or None (see above)."""
        gen = self.gen
        assert gen is not None
        chunks: list[TokenChunk] = []

        async def collect() -> None:
            async for chunk in gen:
                chunks.append(chunk)

        try:
            await asyncio.wait_for(collect(), self.timeout_s)
        except TimeoutError:
            self.failure = "prefill_timeout"
            await gen.cancel("prefill_timeout")
        self.worker_id = gen.worker_id
        self.seconds = time.monotonic() - self.accepted
        self.gen = None
        last = chunks[-1] if chunks else None  # the final one carries the parameters
        if not self.failure and (last is None or last.finish_reason in ("error", "abort")):
            self.failure = "prefill_failed"
        elif not self.failure and last is not None and not last.kv_transfer_params:
            self.failure = "prefill_without_transfer"
        if self.failure:
            log.warning(
                "prefill_fallback",
                request_id=request_id,
                prefill_worker=self.worker_id,
                reason=self.failure,
                error=last.error if last is not None else None,
            )
            await self.release(request_id)
            return None
        return last

    async def release(self, request_id: str) -> None:
        """Tell the prefill worker its blocks for this prefill may go (a second is a no-op)."""
        if self.worker_id:
            with contextlib.suppress(Exception):
                await self.releaser.release_prefill(self.worker_id, request_id)

    async def cancel(self, reason: str, stop_worker: bool) -> None:
        if self.gen is not None:
            await self.gen.cancel(reason, stop_worker)
