"""The token chunks a worker published in the last few seconds, to publish again after a NATS
reconnect. Pure (the caller passes the clock).

Token chunks travel on core NATS: at most once. A chunk in flight to a server that died is gone
(and the stream that captures the subject never saw it), so a frontend waiting for it would
wait for its stall timeout. After a reconnect the worker publishes again every chunk of the
last ``window_s`` seconds; frontends keep a request's chunks in ``(attempt, index)`` order and
drop the ones they already have, so a repeat costs nothing but bytes.
"""

from __future__ import annotations

from collections import deque


class RecentChunks:
    def __init__(self, window_s: float = 10.0, max_items: int = 200_000) -> None:
        self.window_s = window_s
        self.max_items = max_items
        self._items: deque[tuple[float, str, bytes]] = deque()

    def add(self, now: float, subject: str, payload: bytes) -> None:
        items = self._items
        items.append((now, subject, payload))
        while items and (now - items[0][0] > self.window_s or len(items) > self.max_items):
            items.popleft()

    def since(self, now: float) -> list[tuple[str, bytes]]:
        """What was published in the last ``window_s`` seconds, oldest first."""
        return [(s, p) for t, s, p in self._items if now - t <= self.window_s]

    def __len__(self) -> int:
        return len(self._items)
