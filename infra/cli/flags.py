"""Command-line flags derived from a component's config dataclass, declared once.

A ``ConfigFlags`` names the fields of a config class that the command line exposes. From the class
it takes each flag's type (``int``, ``float``, ``str``, ``bool``, ``X | None``, ``Literal`` choices,
``tuple[str, ...]`` as a repeatable flag), its default (shown in ``--help``) and its help text (the
field's docstring or trailing comment). The same object builds the config back from the parsed
arguments (``build``) and turns arguments into the flags that reproduce them in a child process
(``argv``: what ``jetfleet up`` and the local connector pass on).

Flag names are the field names in dashes, without a ``_s`` unit suffix (``drain_timeout_s`` ->
``--drain-timeout``, in seconds), with an optional prefix (``kv_`` -> ``--kv-temperature``). A
``Flag`` renames one, scales its unit (``flush_interval_s`` as ``--flush-interval-ms``) or
overrides its help. Booleans get ``--x/--no-x``. Several sets may declare the same field (the
mocker's and vLLM's ``block_size``): the flag is added once and feeds both configs.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, get_args, get_origin

C = TypeVar("C")

_MISSING = dataclasses.MISSING


class _Unset:
    """No command-line default of its own: the config's applies."""


_UNSET = _Unset()


@dataclass(frozen=True)
class Flag:
    field: str
    name: str | None = None  # the flag, e.g. "--flush-interval-ms" (default: from the field)
    help: str | None = None  # default: the field's docstring or comment
    scale: float = 1.0  # flag value = field value * scale (seconds -> ms: 1000)
    default: Any = _UNSET  # a command-line default different from the config's


def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string after it) or trailing ``# comment``, from the source."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    docs: dict[str, str] = {}
    stmts = body.body
    for i, stmt in enumerate(stmts):
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        name = stmt.target.id
        nxt = stmts[i + 1] if i + 1 < len(stmts) else None
        if (
            isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[name] = " ".join(nxt.value.value.split())
            continue
        line = lines[(stmt.end_lineno or stmt.lineno) - 1]
        if "  # " in line:
            docs[name] = line.split("  # ", 1)[1].strip()
    return docs


@dataclass(frozen=True)
class _Spec:
    field: str
    flag: str
    dest: str
    kind: Any  # the field's type, ``None`` removed
    default: Any  # in flag units
    scale: float
    help: str
    omit_unset: bool  # unset leaves the field to the config (its default) or to the command


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


class ConfigFlags(Generic[C]):
    def __init__(
        self, cls: type[C], *fields: str | Flag, prefix: str = "", title: str | None = None
    ) -> None:
        self.cls = cls
        self.title = title
        hints = typing.get_type_hints(cls)
        by_name = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        docs = field_docs(cls)
        self.specs: list[_Spec] = []
        for item in fields:
            flag = item if isinstance(item, Flag) else Flag(item)
            f = by_name[flag.field]  # KeyError: a typo in a declaration
            base = flag.field.removesuffix("_s") if flag.scale == 1.0 else flag.field
            name = flag.name or "--" + (prefix + base).replace("_", "-")
            if flag.default is not _UNSET:
                default = flag.default
            elif f.default is not _MISSING:
                default = f.default
            elif f.default_factory is not _MISSING:
                default = None  # generated per instance (an id): absent unless given
            else:
                default = None  # required by the config: the command supplies it
            if isinstance(default, int | float) and not isinstance(default, bool):
                default = default * flag.scale if flag.scale != 1.0 else default
            kind, _ = _strip_optional(hints[flag.field])
            text = flag.help or docs.get(flag.field, "")
            # unset and no default of the flag's own: the config's default (or the command's)
            omit_unset = default is None
            self.specs.append(
                _Spec(
                    flag.field,
                    name,
                    name.removeprefix("--").replace("-", "_"),
                    kind,
                    default,
                    flag.scale,
                    text,
                    omit_unset,
                )
            )

    # --- parser -------------------------------------------------------------------------------

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add the flags (a flag already on ``parser``, declared by another set, is kept: both
        sets then read its value, so their defaults must agree; where the configs' defaults
        differ, declare the flag with ``default=None`` and each config keeps its own)."""
        target: argparse.ArgumentParser | argparse._ArgumentGroup = parser
        if self.title:  # one group per title: several sets may fill it
            same = [g for g in parser._action_groups if g.title == self.title]
            target = same[0] if same else parser.add_argument_group(self.title)
        known = parser._option_string_actions
        for spec in self.specs:
            if spec.flag not in known:
                _add(target, spec)
            elif known[spec.flag].default != spec.default:
                raise ValueError(
                    f"{spec.flag}: default {known[spec.flag].default!r} declared by another set, "
                    f"{spec.default!r} by {self.cls.__name__}"
                )

    # --- arguments -> config / argv -----------------------------------------------------------

    def values(self, args: argparse.Namespace) -> dict[str, Any]:
        """The fields given by ``args`` (a flag left unset that has no default of its own is
        omitted: the config's default, or a generated value, applies)."""
        out: dict[str, Any] = {}
        for spec in self.specs:
            value = getattr(args, spec.dest, None)
            if value is None and spec.omit_unset:
                continue
            if isinstance(value, list):
                value = tuple(value)
            elif spec.scale != 1.0 and isinstance(value, int | float):
                value = value / spec.scale
            out[spec.field] = value
        return out

    def build(self, args: argparse.Namespace, **given: Any) -> C:
        return self.cls(**{**self.values(args), **given})

    @property
    def flags(self) -> frozenset[str]:
        return frozenset(spec.flag for spec in self.specs)

    def argv(self, args: argparse.Namespace, exclude: frozenset[str] = frozenset()) -> list[str]:
        """The flags reproducing ``args`` where they differ from the defaults (but ``exclude``:
        the flags another set, sharing them, passes on already)."""
        out: list[str] = []
        for spec in self.specs:
            if spec.flag in exclude:
                continue
            value = getattr(args, spec.dest, None)
            if value == spec.default or value is None:
                continue
            if spec.kind is bool:
                out.append(spec.flag if value else "--no-" + spec.flag.removeprefix("--"))
            elif isinstance(value, list | tuple):
                for item in value:
                    out += [spec.flag, str(item)]
            else:
                out += [spec.flag, str(value)]
        return out


def _add(target: argparse.ArgumentParser | argparse._ArgumentGroup, spec: _Spec) -> None:
    text = spec.help
    if spec.kind is bool:
        target.add_argument(
            spec.flag,
            dest=spec.dest,
            action=argparse.BooleanOptionalAction,
            default=spec.default,
            help=text or None,
        )
        return
    kw: dict[str, Any] = {"dest": spec.dest, "default": spec.default}
    if get_origin(spec.kind) is Literal:
        kw["choices"] = list(get_args(spec.kind))
    elif get_origin(spec.kind) is tuple:
        kw["action"] = "append"
        kw["default"] = []
        kw["metavar"] = spec.dest.upper()
    elif spec.kind in (int, float, str):
        kw["type"] = spec.kind
    else:
        kw["type"] = str
    unit = " ms" if spec.scale == 1000.0 else " s" if spec.field.endswith("_s") else ""
    suffix = "" if spec.default in (None, "", (), []) else f" (default: %(default)s{unit})"
    target.add_argument(spec.flag, help=(text + suffix).strip() or None, **kw)
