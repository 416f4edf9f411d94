"""What the planner records, and the one way both live and replay turn messages into intervals.

Pure (no I/O). Live (``planner.service``) and replay (``planner.replay``) share this module, so
"the same inputs" is true by construction:

- ``IntervalCollector`` takes ``FLEET_METRICS`` messages of one model in stream order (``seq``,
  subject, payload) and hands out ``IntervalInput``: the decoded messages with
  ``after_seq < seq <= last_seq``. A message at or below the last sequence seen (a redelivery) is
  ignored; one that does not decode is reported to the caller (dead letter) and left out.
- ``observation_for`` folds an ``IntervalInput`` into the core's ``IntervalObservation``.
- ``decision_records`` turns the core's decisions into ``ScalingDecided`` messages carrying the
  metrics range, the pre-interval ``PlannerState`` and the ``PlannerConfig`` (msgpack), so a
  decision alone is enough to re-run the interval that made it.
- ``apply_settings`` applies ``key=value`` overrides (``--set``) to a ``PlannerConfig``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from planner.config import IntervalObservation, PlannerConfig
from planner.core import Decision, PlannerState
from planner.observe import summarize
from schemas import HeldRequests, RequestObservation, ScalingDecided, Subjects, WorkerLoad
from schemas.codec import WireDecodeError, decode


def encode_state(state: PlannerState) -> bytes:
    return msgspec.msgpack.encode(state)


def decode_state(data: bytes) -> PlannerState:
    return msgspec.msgpack.decode(data, type=PlannerState) if data else PlannerState()


def encode_config(cfg: PlannerConfig) -> bytes:
    return msgspec.msgpack.encode(cfg)


def decode_config(data: bytes) -> PlannerConfig:
    return msgspec.msgpack.decode(data, type=PlannerConfig)


@dataclass
class IntervalInput:
    after_seq: int
    last_seq: int
    observations: list[RequestObservation] = field(default_factory=list)
    loads: list[WorkerLoad] = field(default_factory=list)
    held: list[HeldRequests] = field(default_factory=list)


class IntervalCollector:
    """Groups one model's metric messages into intervals by stream sequence."""

    def __init__(self, subjects: Subjects, model: str, after_seq: int = 0) -> None:
        self.obs_subject = subjects.obs(model)
        self.load_prefix = subjects.metrics_model(model)[:-1]  # "{p}.metrics.{model}."
        self.held_prefix = subjects.held_model(model)[:-1]  # "{p}.held.{model}."
        self._current = IntervalInput(after_seq, after_seq)

    @property
    def last_seq(self) -> int:
        return self._current.last_seq

    def add(self, seq: int, subject: str, data: bytes) -> str | None:
        """Take one message; returns why it was left out if it does not decode, else None."""
        cur = self._current
        if seq <= cur.last_seq:
            return None
        cur.last_seq = seq
        try:
            if subject == self.obs_subject:
                cur.observations.append(decode(data, RequestObservation))
            elif subject.startswith(self.load_prefix):
                cur.loads.append(decode(data, WorkerLoad))
            elif subject.startswith(self.held_prefix):
                cur.held.append(decode(data, HeldRequests))
            else:
                return f"subject {subject!r} is not a metric of this model"
        except WireDecodeError as exc:
            return str(exc)
        return None

    def close(self) -> IntervalInput:
        """The interval so far; the next one starts after its last sequence."""
        done = self._current
        self._current = IntervalInput(done.last_seq, done.last_seq)
        return done


def observation_for(
    inp: IntervalInput,
    ts_s: float,
    replicas: Mapping[str, int],
    unmanaged: Mapping[str, int] | None = None,
) -> IntervalObservation:
    """The core's input for one collected interval, with the replica counts of discovery (and
    how many of them were started by hand)."""
    return summarize(ts_s, inp.observations, inp.loads, replicas, unmanaged, inp.held)


def recorded_counts(
    group: Iterable[ScalingDecided],
) -> tuple[dict[str, int], dict[str, int]]:
    """The replica counts (all, started by hand) one interval's recorded decisions were made
    from."""
    group = list(group)
    return (
        {d.role: d.current_replicas for d in group},
        {d.role: d.unmanaged_replicas for d in group},
    )


def decision_records(
    model: str,
    decisions: Iterable[Decision],
    cfg: PlannerConfig,
    pre_state: PlannerState,
    inp: IntervalInput,
    dry_run: bool,
) -> list[ScalingDecided]:
    state_blob, cfg_blob = encode_state(pre_state), encode_config(cfg)
    return [
        msgspec.structs.replace(
            d.to_wire(model, dry_run),
            mode=cfg.mode,
            metrics_after_seq=inp.after_seq,
            metrics_last_seq=inp.last_seq,
            planner_state=state_blob,
            planner_config=cfg_blob,
        )
        for d in decisions
    ]


def _parse_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def apply_settings(cfg: PlannerConfig, assignments: Iterable[str]) -> PlannerConfig:
    """``cfg`` with ``key=value`` overrides: ``ttft_target_s=0.3``, ``mode=load``,
    ``min_replicas.agg=2``, ``profile.decode_tokens_per_s=5000``. Values are JSON when they
    parse as JSON, else strings. Unknown keys and bad values raise ``ValueError``."""
    data: dict[str, Any] = msgspec.to_builtins(cfg)
    for item in assignments:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"expected key=value, got {item!r}")
        *path, leaf = key.strip().split(".")
        node = data
        for part in path:
            if not isinstance(node.get(part), dict):
                raise ValueError(f"unknown setting {key!r}")
            node = node[part]
        if not path and leaf not in data:
            raise ValueError(f"unknown setting {key!r}; known: {', '.join(sorted(data))}")
        node[leaf] = _parse_value(raw)
    try:
        return msgspec.convert(data, PlannerConfig)
    except (msgspec.ValidationError, ValueError, TypeError) as exc:
        raise ValueError(f"bad planner settings: {exc}") from exc
