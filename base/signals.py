"""One way for a service to stop: SIGTERM or SIGINT sets an event (or calls a callback) on the
running loop, and the service drains and returns. Every long-running process uses this."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def on_stop_signal(callback: Callable[[], None]) -> None:
    """Call ``callback`` on the running loop when SIGTERM or SIGINT arrives."""
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, callback)


def stop_event() -> asyncio.Event:
    """An event that SIGTERM or SIGINT sets."""
    stop = asyncio.Event()
    on_stop_signal(stop.set)
    return stop
