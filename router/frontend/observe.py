"""What a frontend records about each request it served: its Prometheus metrics, and the
``RequestObservation`` it publishes on ``fleet.obs.{model}`` for the planner and the replay tools
(built by ``router/observation.py``, one per generation; a shed request is one too: demand the
planner must see to scale from zero)."""

from __future__ import annotations

import contextlib
import time

import structlog
from nats.aio.client import Client as NATS

from router.frontend.metrics import FrontendMetrics
from router.frontend.stream import AnyGeneration, Choice
from router.observation import observation
from schemas import RequestObservation, Subjects, encode

log = structlog.get_logger("jetfleet.frontend")


class Observer:
    def __init__(
        self, nc: NATS, subjects: Subjects, metrics: FrontendMetrics, frontend_id: str
    ) -> None:
        self.nc = nc
        self.subjects = subjects
        self.metrics = metrics
        self.frontend_id = frontend_id

    async def generated(
        self, model: str, choices: list[Choice], accepted: float, prompt_len: int, status: str
    ) -> None:
        """A generation request ended (``status``: ok, error, cancelled): each choice's metrics
        and observation."""
        m = self.metrics
        for c in choices:
            gen = c.gen
            osl = len(gen.generated)
            end = c.last_at or time.monotonic()
            if c.first_at:
                m.ttft.labels(model).observe(c.first_at - accepted)
            m.duration.labels(model).observe(end - accepted)
            m.isl.labels(model).observe(prompt_len)
            m.osl.labels(model).observe(osl)
            m.tokens.labels(model, "prompt").inc(prompt_len)
            m.tokens.labels(model, "completion").inc(osl)
            m.tokens.labels(model, "cached").inc(gen.cached_tokens)
            if gen.host_cached_tokens:
                m.tokens.labels(model, "cached_host").inc(gen.host_cached_tokens)
            if gen.attempts > 1:
                m.migrations.labels(model).inc(gen.attempts - 1)
            obs = observation(
                gen,
                status="error" if c.error else status,
                accepted=accepted,
                first_at=c.first_at,
                last_at=c.last_at,
                source=self.frontend_id,
                finish_reason=c.reason,
                error=c.error,
            )
            if obs.kv_transfer_ms:
                m.kv_transfer.labels(model).observe(obs.kv_transfer_ms / 1000)
            await self.publish(model, obs)

    async def embedded(
        self,
        model: str,
        gens: list[AnyGeneration],
        accepted: float,
        status: str,
        error: str | None,
    ) -> None:
        """An embeddings request ended: one observation per input."""
        for gen in gens:
            obs = observation(
                gen,
                status=status,
                accepted=accepted,
                first_at=0.0,
                last_at=time.monotonic(),
                source=self.frontend_id,
                finish_reason="stop" if not error else "error",
                error=error,
            )
            await self.publish(model, obs)

    async def shed(self, rid: str, model: str, prompt_len: int) -> None:
        """A request turned away is demand too: the planner counts it (scale from zero)."""
        obs = RequestObservation(
            request_id=rid,
            model=model,
            status="shed",
            ts_s=time.time(),
            isl_tokens=prompt_len,
            frontend_id=self.frontend_id,
        )
        with contextlib.suppress(Exception):
            await self.nc.publish(self.subjects.obs(model), encode(obs))

    async def publish(self, model: str, obs: RequestObservation) -> None:
        try:
            await self.nc.publish(self.subjects.obs(model), encode(obs))
        except Exception as exc:
            log.warning("observation_publish_failed", request_id=obs.request_id, error=str(exc))
