"""Tool calls out of generated text: one parser per model family, streamed and whole alike. Pure.

A model asked to call a tool writes the call in its family's own syntax; ``--tool-call-parser``
(on the worker, carried in the model card) names it:

==============  ==============================================================================
hermes          ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen 2.5, Hermes)
llama3_json     the output is ``{"name": ..., "parameters": {...}}`` (``; ``-separated for
                several), optionally after ``<|python_tag|>`` (Llama 3.1 / 3.2 JSON)
mistral         ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``, or the v11 form
                ``[TOOL_CALLS]name[ARGS]{...}`` repeated
qwen3_coder     ``<tool_call><function=name><parameter=p>value</parameter>...</function>
                </tool_call>`` (values typed by the tool's parameter schema)
pythonic        the output is ``[f(a=1, b="x"), g()]`` of Python literals, optionally inside
                ``<|python_start|>...<|python_end|>`` (Llama 3.2 / 4 pythonic)
==============  ==============================================================================

``ToolStream`` is the single path for both modes: text before a tool section streams out as
content as soon as it cannot be the start of a marker; from the marker on, the section is held
and parsed when the generation ends. A non-streamed response feeds the whole text once, so both
give the same content and the same calls for the same text. A section that does not parse is
returned as content, never dropped.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

from router.frontend.stops import marker_overlap


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of an object


class ToolParser:
    """One family's syntax: where a tool section starts, and how a section parses."""

    name = ""
    markers: tuple[str, ...] = ()
    at_start_only = False  # the section can only be the whole output (leading space aside)

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        self.tools = {t["name"]: t for t in tools or () if isinstance(t.get("name"), str)}

    def parse(self, section: str) -> tuple[str, list[ParsedCall]] | None:
        """(content left outside the calls, calls); None: not a tool section after all."""
        raise NotImplementedError


def _call(name: Any, arguments: Any) -> ParsedCall:
    if not isinstance(name, str) or not name:
        raise ValueError("a tool call needs a name")
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        arguments = json.loads(arguments)  # a string holding JSON, as some models write it
    if not isinstance(arguments, dict):
        raise ValueError("tool call arguments must be an object")
    return ParsedCall(name, json.dumps(arguments, ensure_ascii=False))


def _json_calls(text: str, args_keys: tuple[str, ...]) -> list[ParsedCall]:
    """A JSON object or an array of them, each ``{"name", <one of args_keys>}``."""
    data = json.loads(text)
    items = data if isinstance(data, list) else [data]
    calls = []
    for item in items:
        if not isinstance(item, dict):
            raise ValueError("a tool call must be a JSON object")
        args = next((item[k] for k in args_keys if k in item), None)
        calls.append(_call(item.get("name"), args))
    return calls


class HermesParser(ToolParser):
    name = "hermes"
    markers = ("<tool_call>",)
    _CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)

    def parse(self, section: str) -> tuple[str, list[ParsedCall]] | None:
        try:
            calls = []
            for m in self._CALL.finditer(section):
                calls.extend(_json_calls(m.group(1).strip(), ("arguments", "parameters")))
        except ValueError:
            return None
        return self._CALL.sub("", section).strip(), calls


class Qwen3CoderParser(ToolParser):
    name = "qwen3_coder"
    markers = ("<tool_call>", "<function=")
    _CALL = re.compile(
        r"(?:<tool_call>\s*)?<function=([^>\n]+)>(.*?)(?:</function>|$)\s*"
        r"(?:</tool_call>)?",
        re.S,
    )
    _PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.S)

    def parse(self, section: str) -> tuple[str, list[ParsedCall]] | None:
        calls = []
        for m in self._CALL.finditer(section):
            name = m.group(1).strip()
            props = self.tools.get(name, {}).get("parameters", {}).get("properties", {})
            args = {}
            for p in self._PARAM.finditer(m.group(2)):
                key = p.group(1).strip()
                args[key] = _typed(p.group(2).strip("\n"), props.get(key, {}))
            calls.append(ParsedCall(name, json.dumps(args, ensure_ascii=False)))
        if not calls:
            return None
        rest = self._CALL.sub("", section).replace("<tool_call>", "").replace("</tool_call>", "")
        return rest.strip(), calls


def _typed(raw: str, schema: dict[str, Any]) -> Any:
    """A qwen3_coder parameter value (always text) as its schema's type; JSON when it parses."""
    kind = schema.get("type")
    if kind == "string":
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    markers = ("<|python_tag|>", "{")
    at_start_only = True

    def parse(self, section: str) -> tuple[str, list[ParsedCall]] | None:
        text = section.strip().removeprefix("<|python_tag|>").strip()
        decoder = json.JSONDecoder()
        calls: list[ParsedCall] = []
        try:
            while text:
                obj, end = decoder.raw_decode(text)
                if not isinstance(obj, dict) or "name" not in obj:
                    return None
                calls.append(_call(obj["name"], obj.get("parameters", obj.get("arguments"))))
                text = text[end:].lstrip().removeprefix(";").lstrip()
        except ValueError:
            return None
        return "", calls


class MistralParser(ToolParser):
    name = "mistral"
    markers = ("[TOOL_CALLS]",)
    _V11 = re.compile(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[ARGS\])?\s*(?=\{)")

    def parse(self, section: str) -> tuple[str, list[ParsedCall]] | None:
        parts = [p.strip() for p in section.split("[TOOL_CALLS]")]
        content, calls = parts[0], []
        decoder = json.JSONDecoder()
        try:
            for part in parts[1:]:
                if part.startswith("["):  # [{"name": ..., "arguments": ...}, ...]
                    data, _ = decoder.raw_decode(part)
                    calls.extend(_json_calls(json.dumps(data), ("arguments", "parameters")))
                    continue
                while part:  # name[ARGS]{...} (v11 tokenizers), possibly repeated
                    m = self._V11.match(part)
                    if m is None:
                        return None
                    args, end = decoder.raw_decode(part, m.end())
                    calls.append(_call(m.group(1), args))
                    part = part[end:].strip()
        except ValueError:
            return None
        return content, calls


class PythonicParser(ToolParser):
    name = "pythonic"
    markers = ("[", "<|python_start|>")
    at_start_only = True

    def parse(self, section: str) -> tuple[str, list[ParsedCall]] | None:
        text = section.strip().removeprefix("<|python_start|>").removesuffix("<|python_end|>")
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError:
            return None
        if not isinstance(tree.body, ast.List) or not tree.body.elts:
            return None
        calls = []
        for node in tree.body.elts:
            if not isinstance(node, ast.Call) or node.args or not isinstance(node.func, ast.Name):
                return None
            try:
                args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
            except ValueError:
                return None
            calls.append(ParsedCall(node.func.id, json.dumps(args, ensure_ascii=False)))
        return "", calls


PARSERS: dict[str, type[ToolParser]] = {
    p.name: p
    for p in (HermesParser, Llama3JsonParser, MistralParser, Qwen3CoderParser, PythonicParser)
}


def tool_parser(name: str, tools: list[dict[str, Any]] | None = None) -> ToolParser:
    """The parser called ``name`` (``ValueError`` naming the known ones otherwise)."""
    cls = PARSERS.get(name)
    if cls is None:
        raise ValueError(f"unknown tool call parser {name!r} (known: {', '.join(sorted(PARSERS))})")
    return cls(tools)


class ToolStream:
    """Content out as it streams, the tool section held and parsed at the end."""

    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self._held = ""  # text that may still start a section
        self._section: str | None = None  # from the marker on
        self._plain = False  # at_start_only: decided there is no section

    def feed(self, text: str) -> str:
        """Content that can go out now."""
        if self._section is not None:
            self._section += text
            return ""
        if self._plain:
            return text
        held = self._held + text
        if self.parser.at_start_only:
            head = held.lstrip()
            if not head:
                self._held = held
                return ""
            if any(head.startswith(m) for m in self.parser.markers):
                self._section, self._held = held, ""
                return ""
            if any(m.startswith(head) for m in self.parser.markers):
                self._held = held
                return ""
            self._plain, self._held = True, ""
            return held
        at = min((i for m in self.parser.markers if (i := held.find(m)) >= 0), default=-1)
        if at >= 0:
            self._section, self._held = held[at:], ""
            return held[:at]
        keep = max((marker_overlap(held, m) for m in self.parser.markers), default=0)
        self._held = held[len(held) - keep :] if keep else ""
        return held[: len(held) - keep]

    def finish(self) -> tuple[str, list[ParsedCall]]:
        """The rest of the content, and the calls."""
        if self._section is None:
            rest, self._held = self._held, ""
            return rest, []
        section, self._section = self._section, None
        parsed = self.parser.parse(section)
        if parsed is None or not parsed[1]:
            return section, []
        return parsed
