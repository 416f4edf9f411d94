"""Deterministic instances of a structured-output constraint (what the mocker generates). Pure.

An engine that samples from logits (vLLM) honours ``response_format`` / guided decoding by
masking tokens. The mocker has no logits: it emits a text that satisfies the constraint, chosen
deterministically from a seed (the same seed gives the same text, a different one usually
another). That is an honest simulation of a constrained model, and it is checked: the tests
validate every instance against its schema with ``jsonschema``.

Supported JSON Schema: ``type`` (one or a list), ``enum``, ``const``, ``properties`` /
``required`` / ``additionalProperties``, ``items`` / ``prefixItems`` / ``minItems`` /
``maxItems``, ``minLength`` / ``maxLength``, ``format`` (date-time, date, time, email, uri, uuid,
ipv4), ``minimum`` / ``maximum`` / ``exclusiveMinimum`` / ``exclusiveMaximum`` / ``multipleOf``,
``anyOf`` / ``oneOf`` (one branch), ``allOf`` (merged), ``$ref`` to ``#/$defs/...`` or
``#/definitions/...``. A schema using anything it cannot satisfy for sure (``pattern``, ``not``,
``if``, ``patternProperties``, a remote ``$ref``, ...) raises ``Unsatisfiable`` naming the keyword,
so the caller can refuse the request with a clear error instead of emitting an invalid text.
``regex`` and ``grammar`` constraints are refused the same way; ``choice`` picks one choice.
"""

from __future__ import annotations

import json
from typing import Any

import xxhash

from schemas.requests import StructuredOutput

_WORDS = (
    "alpha", "bravo", "cobalt", "delta", "ember", "falcon", "garnet", "harbor",
    "indigo", "jasper", "kestrel", "lumen", "meadow", "nimbus", "orchid", "pylon",
)  # fmt: skip
_FORMATS = {
    "date-time": "2026-01-02T03:04:05Z",
    "date": "2026-01-02",
    "time": "03:04:05Z",
    "email": "user@example.com",
    "uri": "https://example.com/a",
    "url": "https://example.com/a",
    "uuid": "123e4567-e89b-12d3-a456-426614174000",
    "ipv4": "192.0.2.1",
    "hostname": "example.com",
}
# Keywords that only annotate, or that an instance built here satisfies anyway.
_IGNORED = frozenset(
    {
        "$schema", "$id", "$comment", "title", "description", "default", "examples",
        "deprecated", "readOnly", "writeOnly", "format", "contentMediaType", "contentEncoding",
        "type", "enum", "const", "properties", "required", "additionalProperties", "items",
        "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum",
        "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "anyOf", "oneOf", "allOf", "$ref",
        "$defs", "definitions", "minProperties", "maxProperties", "uniqueItems", "strict",
        "unevaluatedProperties", "nullable",
    }
)  # fmt: skip
_MAX_DEPTH = 12


class Unsatisfiable(ValueError):
    """The constraint uses something the generator cannot satisfy for sure."""


def problem(structured: StructuredOutput) -> str | None:
    """Why ``render`` would refuse ``structured`` (None: it can be honoured)."""
    try:
        render(structured, 0)
    except Unsatisfiable as exc:
        return str(exc)
    return None


def render(structured: StructuredOutput, seed: int) -> str:
    """The text the mocker generates under ``structured`` for ``seed``."""
    kind = structured.kind()
    if kind == "json_schema":
        try:
            schema = json.loads(structured.json_schema or "")
        except json.JSONDecodeError as exc:
            raise Unsatisfiable(f"the JSON schema is not valid JSON: {exc}") from None
        return json.dumps(instance(schema, seed), ensure_ascii=False, separators=(", ", ": "))
    if kind == "json_object":
        return json.dumps({"result": _word(seed, 0)})
    if kind == "choice":
        return structured.choice[_pick(seed, 1, len(structured.choice))]
    if kind in ("regex", "grammar"):
        raise Unsatisfiable(f"{kind} constraints cannot be honoured by a simulated engine")
    raise Unsatisfiable("no constraint is set")


def instance(schema: Any, seed: int) -> Any:
    """A value valid against ``schema`` (a JSON Schema as parsed JSON), a function of ``seed``."""
    if not isinstance(schema, dict | bool):
        raise Unsatisfiable("a JSON schema must be an object")
    return _Gen(schema if isinstance(schema, dict) else {}, seed).value(schema, "", 0)


def _hash(seed: int, path: str, salt: int) -> int:
    return xxhash.xxh3_64_intdigest(f"{path}#{salt}".encode(), seed & 0xFFFFFFFFFFFFFFFF)


def _pick(seed: int, salt: int, n: int, path: str = "") -> int:
    return _hash(seed, path, salt) % n if n > 1 else 0


def _word(seed: int, salt: int, path: str = "") -> str:
    return _WORDS[_hash(seed, path, salt) % len(_WORDS)]


class _Gen:
    def __init__(self, root: dict[str, Any], seed: int) -> None:
        self.root = root
        self.seed = seed

    def value(self, schema: Any, path: str, depth: int) -> Any:
        if schema is True or schema == {}:
            return _word(self.seed, 2, path)
        if schema is False:
            raise Unsatisfiable(f"the schema at {path or '/'} admits nothing")
        if not isinstance(schema, dict):
            raise Unsatisfiable(f"the schema at {path or '/'} is not an object")
        if depth > _MAX_DEPTH:
            raise Unsatisfiable("the schema nests (or recurses) too deeply")
        unknown = sorted(set(schema) - _IGNORED)
        if unknown:
            raise Unsatisfiable(f"JSON schema keyword {unknown[0]!r} is not supported")
        if "$ref" in schema:
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            return self.value(self._merge(self._ref(schema["$ref"]), rest), path, depth + 1)
        if "allOf" in schema:
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            for part in schema["allOf"]:
                merged = self._merge(merged, self._deref(part))
            return self.value(merged, path, depth + 1)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                branches = schema[key]
                if not branches:
                    raise Unsatisfiable(f"{key} at {path or '/'} is empty")
                rest = {k: v for k, v in schema.items() if k != key}
                # oneOf: the first branch (another could also match the instance built: only the
                # first is certain to be the one chosen). anyOf: one picked by the seed.
                i = 0 if key == "oneOf" else _pick(self.seed, 3, len(branches), path)
                return self.value(self._merge(rest, self._deref(branches[i])), path, depth + 1)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            options = schema["enum"]
            if not options:
                raise Unsatisfiable(f"enum at {path or '/'} is empty")
            return options[_pick(self.seed, 4, len(options), path)]
        kind = self._type(schema, path)
        return getattr(self, f"_{kind}")(schema, path, depth)

    def _type(self, schema: dict[str, Any], path: str) -> str:
        kind = schema.get("type")
        if isinstance(kind, list):
            kinds = [k for k in kind if k != "null"] or ["null"]
            kind = kinds[_pick(self.seed, 5, len(kinds), path)]
        if kind is None:
            if "properties" in schema:
                return "object"
            if "items" in schema or "prefixItems" in schema:
                return "array"
            return "string"
        if kind not in ("object", "array", "string", "integer", "number", "boolean", "null"):
            raise Unsatisfiable(f"unknown JSON schema type {kind!r}")
        return str(kind)

    def _deref(self, schema: Any) -> Any:
        if isinstance(schema, dict) and "$ref" in schema and len(schema) == 1:
            return self._ref(schema["$ref"])
        return schema

    def _ref(self, ref: Any) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise Unsatisfiable(f"$ref {ref!r} is not supported (only local references)")
        node: Any = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise Unsatisfiable(f"$ref {ref!r} points nowhere")
            node = node[part]
        return node

    @staticmethod
    def _merge(a: Any, b: Any) -> dict[str, Any]:
        if not isinstance(a, dict) or not isinstance(b, dict):
            raise Unsatisfiable("allOf / $ref parts must be objects")
        out = dict(a)
        for key, value in b.items():
            if key == "properties" and isinstance(out.get(key), dict):
                out[key] = {**out[key], **value}
            elif key == "required" and isinstance(out.get(key), list):
                out[key] = list(dict.fromkeys([*out[key], *value]))
            elif key in out and out[key] != value and key not in ("title", "description"):
                raise Unsatisfiable(f"allOf parts disagree on {key!r}")
            else:
                out[key] = value
        return out

    # ---- one generator per type ----------------------------------------------------------
    def _object(self, schema: dict[str, Any], path: str, depth: int) -> dict[str, Any]:
        props: dict[str, Any] = schema.get("properties") or {}
        required = list(schema.get("required") or [])
        out: dict[str, Any] = {}
        # every declared property when shallow; only the required ones deeper (recursion ends)
        names = list(props) if depth < _MAX_DEPTH // 2 else [n for n in props if n in required]
        for name in dict.fromkeys([*names, *required]):
            out[name] = self.value(props.get(name, {}), f"{path}/{name}", depth + 1)
        lo = schema.get("minProperties", 0)
        extra = schema.get("additionalProperties", True)
        i = 0
        while len(out) < lo:
            if extra is False:
                raise Unsatisfiable(f"minProperties at {path or '/'} cannot be met")
            name = f"{_word(self.seed, 6 + i, path)}_{i}"
            out[name] = self.value(extra if isinstance(extra, dict) else {}, path + "/*", depth + 1)
            i += 1
        if len(out) > schema.get("maxProperties", len(out)):
            raise Unsatisfiable(f"maxProperties at {path or '/'} cannot be met")
        return out

    def _array(self, schema: dict[str, Any], path: str, depth: int) -> list[Any]:
        prefix = schema.get("prefixItems") or []
        lo = max(schema.get("minItems", 0), len(prefix) if "maxItems" not in schema else 0)
        hi = schema.get("maxItems", max(lo, 2))
        if lo > hi:
            raise Unsatisfiable(f"minItems > maxItems at {path or '/'}")
        n = lo if lo >= 1 else min(hi, 1 + _pick(self.seed, 7, 2, path))
        items = schema.get("items", {})
        out = [
            self.value(prefix[i] if i < len(prefix) else items, f"{path}/{i}", depth + 1)
            for i in range(n)
        ]
        if schema.get("uniqueItems") and len({json.dumps(v, sort_keys=True) for v in out}) < n:
            raise Unsatisfiable(f"uniqueItems at {path or '/'} cannot be met for sure")
        return out

    def _string(self, schema: dict[str, Any], path: str, depth: int) -> str:
        fmt = schema.get("format")
        text = _FORMATS.get(fmt, "") if isinstance(fmt, str) else ""
        if not text:
            text = _word(self.seed, 8, path)
        lo, hi = schema.get("minLength", 0), schema.get("maxLength")
        if fmt in _FORMATS and not (lo <= len(text) <= (hi if hi is not None else len(text))):
            raise Unsatisfiable(f"format {fmt!r} and the length limits at {path or '/'} clash")
        while len(text) < lo:
            text += "-" + _word(self.seed, 9 + len(text), path)
        if hi is not None:
            if hi < lo:
                raise Unsatisfiable(f"minLength > maxLength at {path or '/'}")
            text = text[:hi]
        return text

    def _integer(self, schema: dict[str, Any], path: str, depth: int) -> int:
        return int(self._number(schema, path, depth, integer=True))

    def _number(
        self, schema: dict[str, Any], path: str, depth: int, integer: bool = False
    ) -> float:
        lo, hi, xlo, xhi = (
            _limit(schema, k)
            for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
        )
        step = schema.get("multipleOf", 1 if integer else None)
        low = max([v for v in (lo, xlo) if v is not None], default=None)
        high = min([v for v in (hi, xhi) if v is not None], default=None)
        base = low if low is not None else (high - 100 if high is not None else 0)
        span = 100 if high is None else high - base
        value: float = base + (_hash(self.seed, path, 10) % 1000) / 1000 * span
        if step:
            value = step * round(value / step)
            candidates = [value + k * step for k in (0, 1, -1, 2, -2)]
        else:
            candidates = [round(value, 3), base + span / 2]
        for v in candidates:
            if _in_range(v, lo, hi, xlo, xhi):
                return int(v) if integer else v
        raise Unsatisfiable(f"no number fits the limits at {path or '/'}")

    def _boolean(self, schema: dict[str, Any], path: str, depth: int) -> bool:
        return bool(_hash(self.seed, path, 11) & 1)

    def _null(self, schema: dict[str, Any], path: str, depth: int) -> None:
        return None


def _limit(schema: dict[str, Any], key: str) -> float | None:
    value = schema.get(key)  # draft-4's boolean exclusiveMinimum is not a limit of its own
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _in_range(v: float, lo: Any, hi: Any, xlo: Any, xhi: Any) -> bool:
    return (
        (lo is None or v >= lo)
        and (hi is None or v <= hi)
        and (xlo is None or v > xlo)
        and (xhi is None or v < xhi)
    )
