"""The client a frontend and the router service use: aggregated workers as ever, and for a model
with ``decode`` workers a per-request placement of the prefill (``router/disagg.py``).

Remote placement, for a request ``r``:

1. the decode worker is chosen first (KV-aware over the decode workers, reserved), so the
   decision sees what that worker has cached;
2. ``r-prefill`` goes to the prefill pool (KV-aware over the prefill workers' own events) with
   ``max_tokens=1``, ``min_tokens=1`` and ``kv_transfer_params={"do_remote_decode": true}``;
3. ``r`` goes to the chosen decode worker unchanged but for the ``kv_transfer_params`` the
   prefill returned: the decode worker pulls the prompt's KV, computes the last prompt token and
   generates every token, the first included. The prefill's own token is not used, as in vLLM's
   disaggregation proxy and NVIDIA Dynamo: the whole answer comes from one sampler, and NATS
   clients read one ordinary stream on ``fleet.tok.r``.

A request that will be prefilled locally wherever it lands (a whole prompt under the threshold,
the policy ``never``, or no prefill at all: an embedding) is routed over both pools by a fourth
client (``either``, with a router only) and, when a prefill worker is the best, runs there whole
(``disagg_reason`` ``..._on_prefill``). A prefill worker's queue, for the saturation rule, is the
remote prefills this client has in flight there or the requests it reports waiting, not the
whole requests it decodes.

A prefill that fails, stalls past ``prefill_timeout_s`` or cannot be placed falls back to a local
prefill on the same decode worker: the client sees a normal answer. The prefill worker frees the
blocks it held when the decode worker confirms the pull, when the frontend says none will come
(``kv_release``), or after its own hold timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import msgspec
import structlog

from router.client import FleetClient
from router.disagg import (
    DisaggConfig,
    Placement,
    place,
    routes_over_both_pools,
    stays_on_prefill_worker,
    uncached_tokens,
)
from router.generation import Generation, NoWorkersError, OverloadedError, Routed
from schemas import (
    Request,
    RouteDecision,
    TokenChunk,
    encode,
)
from schemas.control import kv_release
from schemas.requests import prefill_request_id

log = structlog.get_logger("jetfleet.disagg")


class DisaggClient:
    def __init__(
        self,
        agg: FleetClient,
        prefill: FleetClient,
        decode: FleetClient,
        cfg: DisaggConfig,
        either: FleetClient | None = None,
        on_placement: Callable[[str, Placement], None] = lambda _model, _p: None,
    ) -> None:
        """``on_placement(model, placement)`` hears where each request's prefill was placed."""
        self.agg, self.prefill, self.decode = agg, prefill, decode
        # routes over decode and prefill workers alike (local runs that may use a prefill worker)
        self.either = either
        self.cfg = cfg
        self.subjects = agg.subjects
        self.state = agg.state
        self.nc = agg.nc
        self.on_placement = on_placement

    def _clients(self) -> tuple[FleetClient, ...]:
        both = () if self.either is None else (self.either,)
        return (self.agg, self.prefill, self.decode, *both)

    def start(self) -> None:
        for c in self._clients():
            c.start()

    async def stop(self) -> None:
        for c in self._clients():
            await c.stop()

    async def catch_up(self) -> None:
        for c in self._clients():
            await c.catch_up()

    async def generate(
        self, request: Request, traceparent: str | None = None
    ) -> Generation | DisaggGeneration:
        model = request.model
        state = self.state
        lora = request.lora_name
        if not state.candidates(model, "decode", lora=lora) and not state.candidates(
            model, "prefill", lora=lora
        ):
            return await self.agg.generate(request, traceparent)
        # a disaggregated model (decode workers, or prefill workers whose decode workers are not
        # up yet: the decode client waits for them as the aggregated one would, unless the
        # request may run whole on a prefill worker)
        routed, placement, whole_on = await self._route(request)
        if whole_on is not None:  # local anyway: the prefill worker runs it start to end
            placement = Placement(False, f"{placement.reason}_on_prefill")
            self.on_placement(model, placement)
            return await self._local(whole_on, request, traceparent, routed, placement)
        self.on_placement(model, placement)
        if placement.remote:
            accepted = time.monotonic()
            prefill_req = _prefill_request(request)
            try:
                pgen = await self.prefill.generate(prefill_req, traceparent)
            except (NoWorkersError, OverloadedError) as exc:
                log.info("prefill_unplaced", request_id=request.request_id, error=str(exc))
                placement = Placement(False, "prefill_unavailable")
            except BaseException:  # the decode reservation must not outlive the request
                await self.decode.unroute(request.request_id)
                raise
            else:
                return DisaggGeneration(
                    self, request, routed, traceparent, pgen, accepted, placement.reason
                )
        return await self._local(self.decode, request, traceparent, routed, placement)

    @staticmethod
    async def _local(
        client: FleetClient,
        request: Request,
        traceparent: str | None,
        routed: Routed,
        placement: Placement,
    ) -> Generation:
        try:
            return await client.generate(request, traceparent, routed, ("local", placement.reason))
        except BaseException:  # the reservation must not outlive the request
            await client.unroute(request.request_id)
            raise

    async def _route(self, request: Request) -> tuple[Routed, Placement, FleetClient | None]:
        """The worker (reserved) and the placement; and the client that runs the request whole
        when the worker is a prefill worker (``router/disagg.py``), else None."""
        either = self.either
        if either is not None and (
            not _is_prefill(request) or routes_over_both_pools(self.cfg, len(request.token_ids))
        ):
            routed = await either.route_request(request)
            placement = self._place(request, routed[1])
            if not self._is_prefill_worker(routed[1]):
                return routed, placement, None
            if stays_on_prefill_worker(placement):
                return routed, placement, either
            # a race (the prefill pool filled up since): the decode pool, as for a long prompt
            await either.unroute(request.request_id)
        routed = await self.decode.route_request(request)
        return routed, self._place(request, routed[1]), None

    def _is_prefill_worker(self, decision: RouteDecision | None) -> bool:
        view = self.state.workers.get(decision.worker_id) if decision is not None else None
        return view is not None and view.reg.role == "prefill"

    def _place(self, request: Request, decision: RouteDecision | None) -> Placement:
        if not _is_prefill(request):
            return Placement(False, "not_a_prefill")
        overlap, block_size = 0, 16
        if decision is not None:
            chosen = [c for c in decision.candidates if c.worker_id == decision.worker_id]
            overlap = chosen[0].overlap_blocks if chosen else 0
            view = self.state.workers.get(decision.worker_id)
            block_size = view.reg.block_size if view is not None else block_size
        uncached = uncached_tokens(len(request.token_ids), overlap, block_size)
        queued = [
            max(v.remote_prefills, v.load.num_waiting if v.load else 0)
            for v in self.state.candidates(request.model, "prefill", lora=request.lora_name)
        ]
        return place(self.cfg, uncached, queued)

    async def release_prefill(self, worker_id: str, request_id: str) -> None:
        """Tell a prefill worker the blocks it holds for ``request_id``'s remote prefill may go."""
        if not worker_id:
            return
        with contextlib.suppress(Exception):
            await self.nc.publish(
                self.subjects.ctl(worker_id, "kv_release"),
                encode(kv_release(prefill_request_id(request_id))),
            )


def _is_prefill(request: Request) -> bool:
    """A request with a prompt to prefill (not an embedding, not prompt embeddings)."""
    return request.task == "generate" and request.prompt_embeds is None


def _prefill_request(request: Request) -> Request:
    sampling = msgspec.structs.replace(request.sampling, max_tokens=1, min_tokens=1)
    return msgspec.structs.replace(
        request,
        request_id=prefill_request_id(request.request_id),
        sampling=sampling,
        kv_transfer_params={"do_remote_decode": True},
        route=None,
    )


class DisaggGeneration:
    """One remotely prefilled request, iterated like a ``Generation``: the prefill's token, then
    the decode worker's stream (or, when the prefill fails, a local prefill's whole stream)."""

    def __init__(
        self,
        owner: DisaggClient,
        request: Request,
        routed: Routed,
        traceparent: str | None,
        prefill: Generation,
        accepted: float,
        reason: str,
    ) -> None:
        self.owner = owner
        self.request = request
        self.prompt_len = len(request.token_ids)
        self.decision = routed[1]
        self.disagg, self.disagg_reason = "remote", reason
        self.prefill_worker_id = ""
        self.prefill_s = 0.0
        self._routed = routed
        self._traceparent = traceparent
        self._accepted = accepted
        self._prefill: Generation | None = prefill
        self._decode: Generation | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    # what the decode generation knows, once it runs
    @property
    def worker_id(self) -> str:
        if self._decode is not None:
            return self._decode.worker_id
        return self.decision.worker_id if self.decision else ""

    @property
    def attempts(self) -> int:
        return self._decode.attempts if self._decode is not None else 1

    @property
    def generated(self) -> list[int]:
        return self._decode.generated if self._decode is not None else []

    @property
    def cached_tokens(self) -> int:
        return self._decode.cached_tokens if self._decode is not None else 0

    @property
    def host_cached_tokens(self) -> int:
        return self._decode.host_cached_tokens if self._decode is not None else 0

    @property
    def kv_transfer_ms(self) -> float:
        return self._decode.kv_transfer_ms if self._decode is not None else 0.0

    @property
    def pending(self) -> bool:
        current = self._decode or self._prefill
        return current is not None and current.pending

    def __aiter__(self) -> AsyncIterator[TokenChunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[TokenChunk]:
        first = await self._prefill_answer()
        req = self.request
        if first is not None:  # the decode worker pulls the prefill's KV
            req = msgspec.structs.replace(
                req, kv_transfer_params=dict(first.kv_transfer_params or {})
            )
        try:
            self._decode = await self._start_decode(req)
            async for chunk in self._decode:
                yield chunk
        finally:
            if first is not None:
                # Normally the decode worker already told the prefill worker it pulled the KV;
                # if it died first (or the request ended early), this frees the held blocks now
                # rather than at the hold timeout. A second release is a no-op.
                await self.owner.release_prefill(self.prefill_worker_id, self.request_id)

    async def _start_decode(self, request: Request) -> Generation:
        try:
            return await self.owner.decode.generate(
                request, self._traceparent, self._routed, (self.disagg, self.disagg_reason)
            )
        except Exception:
            await self.owner.decode.unroute(request.request_id)
            raise

    async def _prefill_answer(self) -> TokenChunk | None:
        """The prefill's merged answer, or None (failed, stalled, no transfer parameters)."""
        gen = self._prefill
        assert gen is not None
        chunks: list[TokenChunk] = []

        async def collect() -> None:
            async for chunk in gen:
                chunks.append(chunk)

        reason = ""
        try:
            await asyncio.wait_for(collect(), self.owner.cfg.prefill_timeout_s)
        except TimeoutError:
            reason = "prefill_timeout"
            await gen.cancel("prefill_timeout")
        self.prefill_worker_id = gen.worker_id
        self.prefill_s = time.monotonic() - self._accepted
        self._prefill = None
        answer = chunks[-1] if chunks else None  # the final one carries the parameters
        if not reason and (answer is None or answer.finish_reason in ("error", "abort")):
            reason = "prefill_failed"
        elif not reason and answer is not None and not answer.kv_transfer_params:
            reason = "prefill_without_transfer"
        if reason:
            log.warning(
                "prefill_fallback",
                request_id=self.request_id,
                prefill_worker=self.prefill_worker_id,
                reason=reason,
                error=answer.error if answer is not None else None,
            )
            self.disagg, self.disagg_reason = "local", reason
            await self.owner.release_prefill(self.prefill_worker_id, self.request_id)
            return None
        return answer

    async def cancel(self, reason: str = "client_disconnected", stop_worker: bool = True) -> None:
        if self._prefill is not None:
            await self._prefill.cancel(reason, stop_worker)
        if self._decode is not None:
            await self._decode.cancel(reason, stop_worker)
        elif self._prefill is None and self.prefill_worker_id:
            await self.owner.release_prefill(self.prefill_worker_id, self.request_id)
        if self._decode is None:
            await self.owner.decode.unroute(self.request_id)
