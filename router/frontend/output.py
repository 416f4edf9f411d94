"""One choice's generated text -> what the client sees: content, reasoning, tool calls. Pure.

The text of every chunk goes through the same pipeline, streamed or not: the reasoning parser
(``reasoning_content``), then the tool-call handling of the request's ``ToolPlan`` (parsed out of
the text in ``auto`` mode, read from the constrained output in ``required``/named modes). A
non-streamed response is the sum of the deltas, so the two agree for the same text.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from router.frontend.reasoning import ReasoningStream
from router.frontend.tool_parsers import ParsedCall, ToolStream, tool_parser
from router.frontend.tools import ToolPlan


@dataclass(frozen=True)
class OutCall:
    index: int  # position among this choice's calls
    id: str
    name: str
    arguments: str

    def openai(self, with_index: bool = False) -> dict[str, object]:
        out: dict[str, object] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return {"index": self.index, **out} if with_index else out


@dataclass
class Delta:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[OutCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)


class ChoiceOutput:
    def __init__(
        self,
        tools: ToolPlan | None = None,
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
        constrained: bool = False,
    ) -> None:
        """``ValueError`` when ``tools`` asks for parsing (auto) and no parser is known.
        ``constrained``: the engine is held to a grammar from the first token, so only an
        explicit ``<think>`` block is reasoning."""
        self._reasoning = (
            ReasoningStream(reasoning_parser, explicit=constrained) if reasoning_parser else None
        )
        self._plan = tools if tools is not None and tools.mode != "none" else None
        self._stream: ToolStream | None = None
        if self._plan is not None and self._plan.mode == "auto":
            if not tool_call_parser:
                raise ValueError(
                    "this model has no tool call parser configured (worker flag "
                    "--tool-call-parser): use tool_choice 'required' or a named function"
                )
            self._stream = ToolStream(tool_parser(tool_call_parser, self._plan.functions))
        self._constrained: list[str] | None = [] if self._plan and not self._stream else None
        self.calls = 0

    @property
    def markers(self) -> tuple[str, ...]:
        """The texts the parsers look for (kept in the text even when they are special
        tokens: the frontend asks the worker not to skip those)."""
        found = self._stream.parser.markers if self._stream is not None else ()
        return found + (("<think>", "</think>") if self._reasoning is not None else ())

    def feed(self, text: str) -> Delta:
        reasoning, content = self._reasoning.feed(text) if self._reasoning else ("", text)
        return Delta(self._content(content), reasoning)

    def finish(self, finish_reason: str | None) -> tuple[Delta, str | None]:
        """What was held back, and the finish reason (``tool_calls`` when calls were made)."""
        reasoning, content = self._reasoning.finish() if self._reasoning else ("", "")
        content = self._content(content)
        calls: list[ParsedCall] = []
        if self._constrained is not None and self._plan is not None:
            text = "".join(self._constrained)
            parsed = self._plan.constrained_calls(text) if finish_reason == "stop" else None
            if parsed is None:
                content += text  # cut short (length) or not a call: the text, as generated
            calls = parsed or []
        elif self._stream is not None:
            rest, calls = self._stream.finish()
            content += rest
        if self._plan is not None and not self._plan.parallel:
            calls = calls[:1]  # parallel_tool_calls false: the first call only, as vLLM does
        out = [
            OutCall(self.calls + i, _call_id(), c.name, c.arguments) for i, c in enumerate(calls)
        ]
        self.calls += len(out)
        if out and finish_reason == "stop":
            finish_reason = "tool_calls"
        return Delta(content, reasoning, out), finish_reason

    def _content(self, text: str) -> str:
        if self._constrained is not None:
            self._constrained.append(text)
            return ""
        if self._stream is not None:
            return self._stream.feed(text)
        return text


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"
