"""Reasoning out of generated text into ``reasoning_content``, streamed and whole alike. Pure.

``--reasoning-parser`` (on the worker, carried in the model card):

============  ================================================================================
deepseek_r1   the output starts in reasoning (the chat template opened ``<think>``; a leading
              ``<think>`` is dropped) up to ``</think>``; with no ``</think>`` it is all reasoning
qwen3         reasoning only when the output begins with ``<think>`` (Qwen3 with thinking off
              writes none), up to ``</think>``
============  ================================================================================

A constrained answer (a schema, a forced tool call, a choice) is grammar from its first token:
the engine opens no reasoning block for it, so with ``explicit`` only a block the text itself
opens with ``<think>`` is reasoning, whatever the parser (a deepseek_r1 parse would otherwise
take a whole JSON answer for unfinished reasoning).

Text that might be the start of a marker is held back until it is decided, so the pieces a
stream gives concatenate to exactly what the whole text gives.
"""

from __future__ import annotations

from router.frontend.stops import marker_overlap

START, END = "<think>", "</think>"
REASONING_PARSERS = ("deepseek_r1", "qwen3")


class ReasoningStream:
    def __init__(self, parser: str, explicit: bool = False) -> None:
        if parser not in REASONING_PARSERS:
            known = ", ".join(REASONING_PARSERS)
            raise ValueError(f"unknown reasoning parser {parser!r} (known: {known})")
        self.parser = parser
        self._implicit = parser == "deepseek_r1" and not explicit  # output starts in reasoning
        self._state = "start"  # start | reasoning | content
        self._held = ""

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, content) that can go out now."""
        held = self._held + text
        self._held = ""
        reasoning = ""
        if self._state == "start":
            head = held.lstrip()
            if START.startswith(head) and len(head) < len(START):
                self._held = held  # maybe "<thi": wait
                return "", ""
            if head.startswith(START):
                self._state, held = "reasoning", head[len(START) :]
            elif self._implicit:
                self._state = "reasoning"
            else:
                self._state = "content"
        if self._state == "reasoning":
            at = held.find(END)
            if at < 0:
                keep = marker_overlap(held, END)
                self._held = held[len(held) - keep :] if keep else ""
                return held[: len(held) - keep], ""
            reasoning, held = held[:at], held[at + len(END) :]
            self._state = "content"
        return reasoning, held

    def finish(self) -> tuple[str, str]:
        """What was held back: reasoning (an unclosed block) or content."""
        held, self._held = self._held, ""
        if self._state == "reasoning":
            return held, ""
        if self._state == "start" and self._implicit:
            return held.lstrip().removeprefix(START), ""
        return "", held
