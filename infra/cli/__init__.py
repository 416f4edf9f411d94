"""``jetfleet``: one command for every component and tool.

  jetfleet up                      the whole local fleet on embedded NATS + Redis (Ctrl-C stops it)
  jetfleet servers                 only the embedded NATS + Redis
  jetfleet infra init              create/update streams, buckets, object stores
  jetfleet frontend | worker | router-service | indexer     one service process
  jetfleet publish "prompt"        a NATS-only client: submit, stream the answer
  jetfleet status [--json]         live workers, roles, load, KV usage, heartbeat age
  jetfleet planner | connector | replay | profile           scaling and debugging

``jetfleet COMMAND --help`` lists a command's flags with their defaults.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Coroutine
from typing import Any

from infra.cli import fleet, planner, serve
from infra.cli.components import ensure_engine_model, resolve_engine_defaults


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    import uvloop

    return uvloop.run(coro)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="jetfleet", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    fleet.add_commands(sub)
    serve.add_commands(sub)
    planner.add_commands(sub)
    _explain(ap)
    return ap


def _explain(parser: argparse.ArgumentParser) -> None:
    """Every subcommand gets its one-line help as its description, and every option that has a
    default and does not say it shows it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {c.dest: c.help for c in action._choices_actions}
            for name, sub in action.choices.items():
                sub.description = sub.description or helps.get(name)
                _explain(sub)
        elif (
            action.option_strings
            and action.help
            and "default" not in action.help
            and action.default not in (None, False, [], (), "", argparse.SUPPRESS)
        ):
            action.help += " (default: %(default)s)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The parsed flags, with the defaults that depend on other flags filled in."""
    args = build_parser().parse_args(argv)
    resolve_engine_defaults(args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from base.logs import configure_logging
    from schemas import Subjects

    configure_logging(args.log_level, args.log_format)
    ensure_engine_model(args, lambda line: print(f"jetfleet: {line}", flush=True))
    subjects = Subjects(args.subject_prefix)
    from base.kv_read import BucketReadTimeout
    from base.topology import TopologyError
    from base.tracing import TracingUnavailableError
    from infra.tools import NoFleetError

    for family in (fleet, serve, planner):
        if args.cmd in family.COMMANDS:
            try:
                return int(family.run(args, subjects, _run))
            except NoFleetError as exc:  # a tool pointed at the wrong server or prefix
                print(f"jetfleet {args.cmd}: {exc}", file=sys.stderr)
                return 1
            except BucketReadTimeout as exc:  # a server too slow to list what it holds
                print(
                    f"jetfleet {args.cmd}: {exc} (is the NATS server overloaded?)", file=sys.stderr
                )
                return 1
            except TracingUnavailableError as exc:  # configured, not installed
                print(f"jetfleet {args.cmd}: {exc}", file=sys.stderr)
                return 2
            except TopologyError as exc:  # no room for the streams, or one made otherwise
                print(f"jetfleet {args.cmd}: {exc}", file=sys.stderr)
                return 2
    print(f"jetfleet: unknown command {args.cmd}", file=sys.stderr)
    return 2
