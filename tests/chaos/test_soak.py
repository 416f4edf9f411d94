"""The soak (``tests/chaos/soak.py``) against ``jetfleet up``: a short run in the default suite
checks the harness and that every request is answered; ``-m slow`` runs the 30-minute soak and
holds every process's RSS within 5% between the start and the end of the measured window."""

from __future__ import annotations

import json

import pytest

from tests.chaos.soak import soak

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("minutes", "warmup", "bound_pct"),
    [
        pytest.param(0.4, 0.2, None, id="fast"),
        # judged after 16.5 minutes: FLEET_TOKENS keeps 15 minutes of chunks (in memory), so
        # nats-server grows by design until the stream reaches its retention
        pytest.param(30.0, 0.55, 5.0, id="30min", marks=pytest.mark.slow),
    ],
)
async def test_soak_keeps_every_request_and_memory_flat(
    minutes: float, warmup: float, bound_pct: float | None
) -> None:
    every_s = 2.0 if minutes < 1 else 15.0
    result = await soak(minutes, concurrency=16, every_s=every_s, warmup=warmup)
    print("\nsoak:", json.dumps(result))
    requests = result["requests"]
    assert isinstance(requests, dict) and set(requests) == {"ok"} and requests["ok"] > 0
    names = " ".join(result["processes"])  # type: ignore[arg-type]
    for part in ("nats-server", "redis-server", "frontend", "indexer", "planner", "worker"):
        assert part in names, names
    if bound_pct is not None:
        assert result["max_growth_pct"] <= bound_pct, result
