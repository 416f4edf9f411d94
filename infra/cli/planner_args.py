"""Command-line settings of the planner: flags for the common ones, ``--set key=value`` for any
field of ``PlannerConfig`` (see ``planner.records.apply_settings``)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from planner.capacity import CapacityProfile, load_profile, mocker_profile
from planner.config import PlannerConfig
from planner.predictors import PREDICTOR_NAMES
from planner.records import apply_settings


def parse_profile(spec: str) -> CapacityProfile:
    """``mocker`` or ``mocker:SPEEDUP`` (derived from the mocker's timing model), else a JSON
    file written by ``jetfleet profile``."""
    if spec == "mocker" or spec.startswith("mocker:"):
        _, _, speedup = spec.partition(":")
        return mocker_profile(speedup=float(speedup or 1.0))
    return load_profile(spec)


def role_counts(items: list[str], flag: str) -> dict[str, int]:
    """``ROLE=N`` items of a repeatable flag."""
    out: dict[str, int] = {}
    for item in items:
        role, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"{flag} expects ROLE=N, got {item!r}")
        out[role] = int(value)
    return out


def add_planner_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--interval", type=float, default=None, help="adjustment interval, s (30)")
    p.add_argument("--ttft-target", type=float, default=None, help="p90 TTFT target, s (0.5)")
    p.add_argument("--itl-target", type=float, default=None, help="mean ITL target, s (0.05)")
    p.add_argument(
        "--mode",
        choices=["throughput", "load"],
        default=None,
        help="throughput: size for predicted demand; load: react to measured load (throughput)",
    )
    p.add_argument(
        "--predictor",
        choices=sorted(PREDICTOR_NAMES),
        default=None,
        help="demand predictor of throughput mode",
    )
    p.add_argument(
        "--profile", default=None, help="capacity profile: JSON file, or mocker[:SPEEDUP]"
    )
    p.add_argument(
        "--min-replicas", action="append", default=[], metavar="ROLE=N", help="per role (1)"
    )
    p.add_argument(
        "--max-replicas", action="append", default=[], metavar="ROLE=N", help="per role (8)"
    )
    p.add_argument("--max-total-replicas", type=int, default=None, help="GPU budget (16)")
    p.add_argument("--scale-up-cooldown", type=float, default=None, help="s (60)")
    p.add_argument("--scale-down-cooldown", type=float, default=None, help="s (300)")
    p.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any PlannerConfig field, e.g. scale_down_margin=0.7 or min_replicas.agg=2",
    )


def planner_config(args: argparse.Namespace, base: PlannerConfig | None = None) -> PlannerConfig:
    cfg = base or PlannerConfig()
    flags: dict[str, Any] = {
        "adjustment_interval_s": args.interval,
        "ttft_target_s": args.ttft_target,
        "itl_target_s": args.itl_target,
        "mode": args.mode,
        "predictor": args.predictor,
        "max_total_replicas": args.max_total_replicas,
        "scale_up_cooldown_s": args.scale_up_cooldown,
        "scale_down_cooldown_s": args.scale_down_cooldown,
    }
    changes = {k: v for k, v in flags.items() if v is not None}
    if args.profile:
        changes["profile"] = parse_profile(args.profile)
    if args.min_replicas:
        changes["min_replicas"] = {**cfg.min_replicas, **role_counts(args.min_replicas, "--min")}
    if args.max_replicas:
        changes["max_replicas"] = {**cfg.max_replicas, **role_counts(args.max_replicas, "--max")}
    cfg = replace(cfg, **changes)
    return apply_settings(cfg, args.settings)
