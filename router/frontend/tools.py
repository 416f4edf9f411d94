"""What a request's ``tools`` / ``tool_choice`` ask for, and how each mode gets its calls. Pure.

- ``none`` (or no tools): plain text, no parsing.
- ``auto``: the model decides; calls are parsed out of its text by the model's parser
  (``tool_parsers``); without a parser configured for the model, ``auto`` with tools is a 400.
- ``required`` / a named function: the engine is constrained (``StructuredOutput``) to emit the
  call itself, as vLLM does: for a named function the JSON of its arguments (validated by the
  function's ``parameters`` schema), for ``required`` a JSON array of ``{"name", "parameters"}``
  (one item unless ``parallel_tool_calls``). Every answer is a call whose arguments validate
  against the function's schema, whatever the model family, and no parser is needed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from router.frontend.tool_parsers import ParsedCall
from schemas.requests import StructuredOutput

ToolMode = Literal["none", "auto", "required", "named"]


class ToolChoiceError(ValueError):
    """An invalid ``tools`` / ``tool_choice``: ``param`` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolPlan:
    mode: ToolMode
    functions: list[dict[str, Any]] = field(default_factory=list)  # {name, description, parameters}
    named: str | None = None
    parallel: bool = True

    def template_tools(self) -> list[dict[str, Any]] | None:
        """``tools`` for the chat template (the OpenAI form, as HF templates expect)."""
        if not self.functions:
            return None
        return [{"type": "function", "function": f} for f in self.functions]

    def constraint(self) -> StructuredOutput | None:
        """The engine constraint of ``required`` / named modes (None otherwise)."""
        if self.mode == "named":
            fn = next(f for f in self.functions if f["name"] == self.named)
            return StructuredOutput(json_schema=json.dumps(_parameters(fn)))
        if self.mode != "required":
            return None
        branches = [
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [f["name"]]},
                    "parameters": _parameters(f),
                },
                "required": ["name", "parameters"],
            }
            for f in self.functions
        ]
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": branches}}
        if not self.parallel:
            schema["maxItems"] = 1
        return StructuredOutput(json_schema=json.dumps(schema))

    def constrained_calls(self, text: str) -> list[ParsedCall] | None:
        """The calls in a constrained output (None: it is not one, e.g. cut by max_tokens)."""
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if self.mode == "named" and isinstance(data, dict):
            return [ParsedCall(self.named or "", json.dumps(data, ensure_ascii=False))]
        if self.mode == "required" and isinstance(data, list) and data:
            calls = []
            for item in data:
                if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                    return None
                args = item.get("parameters", item.get("arguments", {}))
                calls.append(ParsedCall(item["name"], json.dumps(args, ensure_ascii=False)))
            return calls
        return None


def _parameters(fn: dict[str, Any]) -> dict[str, Any]:
    params = fn.get("parameters")
    return params if isinstance(params, dict) and params else {"type": "object", "properties": {}}


def plan_tools(tools: list[Any] | None, tool_choice: Any, parallel: bool | None) -> ToolPlan:
    """Check ``tools`` / ``tool_choice`` as OpenAI does and say what the request asks."""
    functions = []
    for i, tool in enumerate(tools or ()):
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise ToolChoiceError(f"tools[{i}].type", "only tools of type 'function' are served")
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ToolChoiceError(f"tools[{i}].function.name", "each tool needs a function name")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise ToolChoiceError(
                f"tools[{i}].function.parameters", "parameters must be a JSON Schema object"
            )
        functions.append(
            {k: v for k, v in fn.items() if k in ("name", "description", "parameters")}
        )
    names = [f["name"] for f in functions]
    if len(set(names)) != len(names):
        raise ToolChoiceError("tools", "tool function names must be unique")
    parallel = True if parallel is None else parallel
    if tool_choice is None:
        tool_choice = "auto" if functions else "none"
    if isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise ToolChoiceError(
                "tool_choice", "tool_choice must be 'none', 'auto', 'required' or a function"
            )
        if tool_choice != "none" and not functions:
            raise ToolChoiceError("tool_choice", f"tool_choice '{tool_choice}' needs tools")
        mode: ToolMode = "none" if not functions else tool_choice  # type: ignore[assignment]
        return ToolPlan(mode, functions, None, parallel)
    name = (
        (tool_choice.get("function") or {}).get("name") if isinstance(tool_choice, dict) else None
    )
    if not isinstance(name, str):
        raise ToolChoiceError(
            "tool_choice", "tool_choice must be a string or {'type': 'function', 'function': {...}}"
        )
    if name not in names:
        raise ToolChoiceError("tool_choice", f"tool_choice names '{name}', which is not in tools")
    return ToolPlan("named", functions, name, parallel)
