"""Stop strings, applied by the frontend to the streamed text (pure).

Text is released as soon as it cannot be the start of a stop string; a suffix that could still
grow into one is held back. When a stop string appears, everything before it is released and the
stream ends with ``finish_reason="stop"`` (the stop string itself is not returned, as in OpenAI).
"""

from __future__ import annotations

from collections.abc import Sequence


def marker_overlap(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that is a proper beginning of ``marker`` (text
    that must be held back: it may still become the marker)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class StopMatcher:
    __slots__ = ("_held", "_stops", "matched", "stopped")

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, text: str) -> str:
        """Return the text safe to emit now; sets ``stopped`` when a stop string matched."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        buf = self._held + text
        found = [(i, s) for s in self._stops if (i := buf.find(s)) >= 0]
        cut = min(found)[0] if found else -1
        if cut >= 0:
            self.matched = min(found)[1]
            self.stopped = True
            self._held = ""
            return buf[:cut]
        keep = max((marker_overlap(buf, s) for s in self._stops), default=0)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """At the end of the stream: whatever was held back is plain text after all."""
        out, self._held = self._held, ""
        return "" if self.stopped else out
