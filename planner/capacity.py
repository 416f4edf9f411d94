"""Capacity model: how much load one replica serves while meeting the latency targets.

The planner sizes pools from a deliberately simple model, one ``CapacityProfile`` per deployment:

- ``prefill_tokens_per_s``: uncached prompt tokens one replica prefills per second while the time
  to first token stays within its target. Prefill demand is ``rps * (isl - cached)`` tokens/s.
- ``decode_tokens_per_s``: tokens one replica generates per second (over its whole batch) while
  the inter-token latency stays within its target. Decode demand is ``rps * osl`` tokens/s.

Replicas needed for a phase = ``ceil(demand / (capacity * correction))``. A profile is measured
once per model and GPU (or derived, as for the mocker) and stored as JSON::

    {"prefill_tokens_per_s": 33190.9, "decode_tokens_per_s": 6306.5, "description": "..."}

``DEFAULT_PROFILE`` is ``mocker_profile()``: the mocker at ``speedup`` 1, derived from its timing
model (``workers/engines/mocker/timing.py``, Dynamo's polynomial fits):

- prefill step of one sequence of ``T`` new tokens: ``4.209989e-07*T^2 + 1.518344e-02*T +
  16.50142`` ms, so at the reference prompt of 2048 tokens 49.4 ms, i.e. 41.5k tokens/s;
- decode step at KV usage ``u``: ``-25.74*u^2 + 54.01*u + 5.74`` ms for the whole batch of up to
  256 sequences, so at ``u`` = 0.8 32.5 ms, i.e. 7.9k tokens/s (and an ITL of 32.5 ms);
- both times ``headroom`` 0.8, because prefill and decode share the mocker's steps and a pool
  run at 100% queues. Result: 33.2k prefill tokens/s and 6.3k decode tokens/s per replica.
  With ``speedup`` s, multiply both by s (``CapacityProfile.scaled``).

``OnlineCorrection`` refines the profile while running: one multiplicative factor per phase
(``"prefill"`` from TTFT, ``"decode"`` from ITL), an EWMA of ``target / observed`` latency:
``factor = (1 - alpha) * factor + alpha * factor * target / observed``, clamped to
``[min_factor, max_factor]`` (default 0.25..1, ``alpha`` 0.3) and raised by at most
``max_raise`` (1.1) per update, so a fast interval never buys much trust at once. Observed latency
above target means the profile promised too much, so the factor shrinks and the pool grows. The
planner only feeds it intervals where the pool was busy enough for latency to say something
about capacity.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

PHASES: tuple[str, ...] = ("prefill", "decode")


@dataclass(frozen=True)
class CapacityProfile:
    prefill_tokens_per_s: float
    """Uncached prompt tokens/s one replica prefills within the TTFT target."""
    decode_tokens_per_s: float
    """Output tokens/s one replica generates (whole batch) within the ITL target."""
    description: str = ""
    """Where the numbers come from (model, GPU, engine settings, date)."""

    def __post_init__(self) -> None:
        if self.prefill_tokens_per_s <= 0 or self.decode_tokens_per_s <= 0:
            raise ValueError("capacities must be positive")

    def capacity(self, phase: str) -> float:
        """Tokens/s of one replica for ``phase`` (``"prefill"`` or ``"decode"``)."""
        if phase == "prefill":
            return self.prefill_tokens_per_s
        if phase == "decode":
            return self.decode_tokens_per_s
        raise ValueError(f"unknown phase {phase!r}")

    def scaled(self, factor: float) -> CapacityProfile:
        """The profile with both capacities multiplied by ``factor`` (e.g. mocker speedup)."""
        return replace(
            self,
            prefill_tokens_per_s=self.prefill_tokens_per_s * factor,
            decode_tokens_per_s=self.decode_tokens_per_s * factor,
            description=f"{self.description} (scaled x{factor:g})".strip(),
        )

    def to_dict(self) -> dict[str, float | str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> CapacityProfile:
        return cls(
            prefill_tokens_per_s=float(data["prefill_tokens_per_s"]),  # type: ignore[arg-type]
            decode_tokens_per_s=float(data["decode_tokens_per_s"]),  # type: ignore[arg-type]
            description=str(data.get("description", "")),
        )


def _mocker_prefill_ms(tokens: float) -> float:
    return 4.209989e-07 * tokens * tokens + 1.518344e-02 * tokens + 16.50142


def _mocker_decode_ms(kv_usage: float) -> float:
    return max(-25.74 * kv_usage * kv_usage + 54.01 * kv_usage + 5.74, 1.0)


def mocker_profile(
    reference_isl_tokens: int = 2048,
    kv_usage: float = 0.8,
    max_num_seqs: int = 256,
    headroom: float = 0.8,
    speedup: float = 1.0,
) -> CapacityProfile:
    """The mocker's capacity, derived from its timing model (see the module docstring)."""
    prefill = 1000.0 * reference_isl_tokens / _mocker_prefill_ms(reference_isl_tokens)
    decode = 1000.0 * max_num_seqs / _mocker_decode_ms(kv_usage)
    return CapacityProfile(
        prefill_tokens_per_s=round(prefill * headroom * speedup, 1),
        decode_tokens_per_s=round(decode * headroom * speedup, 1),
        description=(
            f"mocker speedup={speedup} isl={reference_isl_tokens} kv_usage={kv_usage} "
            f"max_num_seqs={max_num_seqs} headroom={headroom}"
        ),
    )


DEFAULT_PROFILE = mocker_profile()


def load_profile(path: str | Path) -> CapacityProfile:
    """Read a profile from a JSON file (the one place in ``planner/`` core that reads a file)."""
    return CapacityProfile.from_dict(json.loads(Path(path).read_text()))


def save_profile(profile: CapacityProfile, path: str | Path) -> None:
    """Write ``profile`` as JSON to ``path``."""
    Path(path).write_text(json.dumps(profile.to_dict(), indent=2, sort_keys=True) + "\n")


@dataclass(frozen=True)
class OnlineCorrection:
    """Per-phase multiplicative correction of a ``CapacityProfile``; immutable, updates return a
    new value. ``factors`` holds ``(phase, factor)`` pairs sorted by phase; missing = 1.0."""

    factors: tuple[tuple[str, float], ...] = ()
    alpha: float = 0.3
    """EWMA weight of the newest observation, in (0, 1]."""
    min_factor: float = 0.25
    """Lower clamp: the profile is never trusted less than this."""
    max_factor: float = 1.0
    """Upper clamp: the profile is never trusted more than this. Default 1: latency stays flat
    until a pool saturates, so a fast interval says "not saturated", not "more capacity"; the
    correction only takes trust away after missed targets and gives it back slowly."""
    max_raise: float = 1.1
    """A factor grows at most this much per update: trust is earned slowly and lost fast."""

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1]")
        if not 0.0 < self.min_factor <= 1.0 <= self.max_factor or self.max_raise < 1.0:
            raise ValueError("need 0 < min_factor <= 1 <= max_factor and max_raise >= 1")

    def factor(self, phase: str) -> float:
        return dict(self.factors).get(phase, 1.0)

    def update(self, phase: str, observed_s: float, target_s: float) -> OnlineCorrection:
        """Fold one interval's observed latency against its target into ``phase``'s factor.
        Non-positive inputs (no data) leave it unchanged."""
        if observed_s <= 0.0 or target_s <= 0.0:
            return self
        current = self.factor(phase)
        ratio = target_s / observed_s
        new = (1.0 - self.alpha) * current + self.alpha * current * ratio
        new = min(max(new, self.min_factor), self.max_factor, current * self.max_raise)
        factors = dict(self.factors)
        factors[phase] = new
        return replace(self, factors=tuple(sorted(factors.items())))

    def apply(self, profile: CapacityProfile, phase: str) -> float:
        """Corrected tokens/s of one replica for ``phase``."""
        return profile.capacity(phase) * self.factor(phase)
