"""Driving an engine through the worker's ``workers.engine.Engine`` interface, as the runtime
does: a sink that keeps what the engine sends."""

from __future__ import annotations

import asyncio

from workers.engine import EngineOutput


class Sink:
    """An ``OutputSink`` that keeps every output; ``done`` is set by the final one."""

    def __init__(self) -> None:
        self.outputs: list[EngineOutput] = []
        self.done = asyncio.Event()

    def on_output(self, output: EngineOutput) -> None:
        self.outputs.append(output)
        if output.finished:
            self.done.set()

    @property
    def tokens(self) -> list[int]:
        return [t for o in self.outputs for t in o.new_token_ids]

    @property
    def final(self) -> EngineOutput | None:
        return self.outputs[-1] if self.outputs and self.outputs[-1].finished else None
