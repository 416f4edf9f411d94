"""The command line that runs one ``jetfleet`` command in a child process, with this interpreter.

Whatever starts component processes (``up``, ``frontend --processes``, the local scaling connector,
the tests and benchmarks) builds their argv here, so every process runs exactly what an operator
types: ``jetfleet worker ...`` is ``python -m infra.cli worker ...``.
"""

from __future__ import annotations

import sys


def cli_command(*args: str) -> list[str]:
    """``jetfleet ARGS...`` as an argv for ``subprocess``."""
    return [sys.executable, "-m", "infra.cli", *args]
