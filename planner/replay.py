"""``jetfleet replay planner``: re-run the planner core over the recorded metric stream.

The recorded decisions of ``[from, to]`` (``FLEET_SCALING``) say which intervals the live planner
planned: their metrics range, the replica counts it saw, its state before the first one and its
settings. Replay reads the same ``FLEET_METRICS`` messages, folds them with the same
``IntervalCollector``, and runs ``plan`` interval after interval from the recorded starting
state, with the recorded settings plus any ``--set`` overrides:

- without overrides it must reproduce every recorded decision exactly (desired replicas,
  reasons, predictions, ids); ``--check`` exits 1 on any difference;
- with overrides it shows what other settings would have decided *on the same observations*
  (the replica counts stay the recorded ones: the real fleet did not follow the replayed
  decisions). If ``predictor`` or ``predictor_params`` change, the recorded predictor state does
  not fit and the predictors start cold at ``from``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from nats.js import JetStreamContext

from base.stream_read import read_range
from planner.config import PlannerConfig
from planner.core import Decision, PlannerState, plan
from planner.records import (
    IntervalCollector,
    apply_settings,
    decode_config,
    decode_state,
    observation_for,
    recorded_counts,
)
from schemas import ScalingDecided, Subjects, WireDecodeError, decode

_RELATIVE = re.compile(r"^-?(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_time(text: str, now_s: float | None = None) -> float:
    """Epoch seconds from ``now``, ``15m`` or ``-15m`` (s/m/h/d ago), epoch seconds, or ISO
    8601 (UTC unless it says otherwise)."""
    now = time.time() if now_s is None else now_s
    text = text.strip()
    if text == "now":
        return now
    if m := _RELATIVE.match(text):
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValueError(
            f"cannot read time {text!r} (now, 15m ago as 15m, epoch, ISO 8601)"
        ) from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


@dataclass(frozen=True)
class ReplayRow:
    recorded: ScalingDecided
    replayed: Decision
    differences: tuple[str, ...]


@dataclass
class ReplayReport:
    rows: list[ReplayRow] = field(default_factory=list)
    intervals: int = 0
    messages: int = 0
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def differing(self) -> int:
        return sum(1 for r in self.rows if r.differences)


def group_intervals(decisions: Iterable[ScalingDecided]) -> list[list[ScalingDecided]]:
    """Recorded decisions grouped by the interval that made them, in decision order."""
    groups: dict[tuple[int, float], list[ScalingDecided]] = {}
    for d in sorted(decisions, key=lambda d: d.decision_id):
        groups.setdefault((d.metrics_last_seq, d.ts_s), []).append(d)
    return list(groups.values())


def compare(recorded: ScalingDecided, replayed: Decision) -> tuple[str, ...]:
    fields = (
        ("desired_replicas", recorded.desired_replicas, replayed.desired),
        ("current_replicas", recorded.current_replicas, replayed.current),
        ("reasons", recorded.reasons, replayed.reasons),
        ("predicted_rps", recorded.predicted_rps, replayed.predicted_rps),
        ("predicted_isl", recorded.predicted_isl, replayed.predicted_isl),
        ("predicted_osl", recorded.predicted_osl, replayed.predicted_osl),
        ("decision_id", recorded.decision_id, replayed.decision_id),
    )
    return tuple(f"{name}: recorded {a!r}, replayed {b!r}" for name, a, b in fields if a != b)


def _start_state(first: ScalingDecided, live: PlannerConfig, cfg: PlannerConfig) -> PlannerState:
    state = decode_state(first.planner_state)
    if (cfg.predictor, dict(cfg.predictor_params)) != (live.predictor, dict(live.predictor_params)):
        state = replace(state, predictors=PlannerState().predictors)
    return state


def replay_intervals(
    subjects: Subjects,
    model: str,
    groups: Sequence[list[ScalingDecided]],
    messages: Sequence[tuple[int, str, bytes]],
    overrides: Sequence[str] = (),
) -> ReplayReport:
    """Pure: re-plan ``groups`` (from ``group_intervals``) over the metric ``messages``."""
    report = ReplayReport()
    if not groups:
        return report
    live = decode_config(groups[0][0].planner_config)
    cfg = apply_settings(live, overrides)
    report.settings = {"overrides": list(overrides)}
    state = _start_state(groups[0][0], live, cfg)
    ordered = sorted(messages)
    pos = 0
    for group in groups:
        head = group[0]
        group_live = decode_config(head.planner_config)
        if group_live != live:  # the live planner was restarted with other settings
            live, cfg = group_live, apply_settings(group_live, overrides)
        collector = IntervalCollector(subjects, model, head.metrics_after_seq)
        while pos < len(ordered) and ordered[pos][0] <= head.metrics_after_seq:
            pos += 1
        while pos < len(ordered) and ordered[pos][0] <= head.metrics_last_seq:
            seq, subject, data = ordered[pos]
            collector.add(seq, subject, data)
            report.messages += 1
            pos += 1
        inp = collector.close()
        inp.last_seq = head.metrics_last_seq
        obs = observation_for(inp, head.ts_s, *recorded_counts(group))
        state, decisions = plan(cfg, state, obs)
        by_role = {d.role: d for d in decisions}
        for rec in group:
            got = by_role.get(rec.role)
            if got is None:
                continue
            diffs = compare(rec, got) if not overrides else ()
            report.rows.append(ReplayRow(rec, got, diffs))
        report.intervals += 1
    return report


async def replay_planner(
    js: JetStreamContext,
    subjects: Subjects,
    model: str,
    from_s: float,
    to_s: float,
    overrides: Sequence[str] = (),
) -> ReplayReport:
    start = datetime.fromtimestamp(from_s, UTC)
    raw = await read_range(
        js, subjects.stream_name("SCALING"), (subjects.scale_model(model),), start_time=start
    )
    recorded: list[ScalingDecided] = []
    for _seq, _subject, data in raw:
        try:
            d = decode(data, ScalingDecided)
        except WireDecodeError:
            continue
        if from_s <= d.ts_s <= to_s and d.planner_config:
            recorded.append(d)
    groups = group_intervals(recorded)
    if not groups:
        return ReplayReport()
    first, last = groups[0][0], groups[-1][0]
    messages = await read_range(
        js,
        subjects.stream_name("METRICS"),
        subjects.planner_inputs(model),
        first.metrics_after_seq + 1,
        last.metrics_last_seq,
    )
    return replay_intervals(subjects, model, groups, messages, overrides)


def report_json(report: ReplayReport) -> dict[str, Any]:
    return {
        "intervals": report.intervals,
        "messages": report.messages,
        "decisions": len(report.rows),
        "differing": report.differing,
        "settings": report.settings,
        "rows": [
            {
                "ts_s": r.recorded.ts_s,
                "role": r.recorded.role,
                "current": r.recorded.current_replicas,
                "recorded_desired": r.recorded.desired_replicas,
                "replayed_desired": r.replayed.desired,
                "recorded_reasons": list(r.recorded.reasons),
                "replayed_reasons": list(r.replayed.reasons),
                "differences": list(r.differences),
            }
            for r in report.rows
        ],
    }


def print_report(report: ReplayReport, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report_json(report), indent=2))
        return
    if not report.rows:
        print("no recorded planner decisions in that time range")
        return
    for r in report.rows:
        ts = datetime.fromtimestamp(r.recorded.ts_s, UTC).strftime("%H:%M:%S")
        mark = "DIFF" if r.differences else ("    " if not report.settings["overrides"] else "")
        print(
            f"{ts} {r.recorded.role:<8} current {r.recorded.current_replicas:>2}  recorded "
            f"{r.recorded.desired_replicas:>2}  replayed {r.replayed.desired:>2} {mark} "
            f"{'; '.join(r.replayed.reasons)}"
        )
        for diff in r.differences:
            print(f"    {diff}")
    print(
        f"{report.intervals} intervals, {report.messages} metric messages, "
        f"{len(report.rows)} decisions, {report.differing} differ"
    )
