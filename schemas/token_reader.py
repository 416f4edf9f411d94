"""A request's answer put together from its token chunks, as the wire contract says to.

A NATS client reads ``fleet.tok.{request_id}`` and may see, besides the chunks in order:

- **repeats**: a worker publishes its last seconds of chunks again after a NATS reconnect;
- **an older attempt's chunks after a newer one's**: the request migrated (its worker stalled or
  left) while the old worker still had chunks on their way (held in its client while it was
  paused or cut off, delivered when it came back);
- **an older attempt's last chunks before the newer one's first**: chunks its router had not
  seen when it migrated, which the newer attempt generates again.

``TokenReader.take`` drops the first two and, when the first chunk (index 0) of a newer attempt
comes, cuts the answer back to the ``generated_before`` tokens that attempt continues from.
Chunks are whole messages and a router migrates after whole chunks, so a cut falls between
chunks; one that does not keeps the tokens before the cut and loses that chunk's text.

An older attempt's final chunk that comes before any chunk of the newer attempt ends the answer:
the old worker finished it, with the same sampling, while the router was moving it.

What the reader missed (it was disconnected) it says, and does not invent: ``missing()`` lists the
``(attempt, index)`` it never saw below the newest index of each attempt, and ``behind`` the
tokens a newer attempt continues from that it never had. A cut made while chunks were missing
counts tokens without them, so a reader with anything missing reads the request's chunks back
from ``FLEET_TOKENS`` (in stream order) into a fresh reader. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from schemas.tokens import TokenChunk


@dataclass
class TokenReader:
    attempt: int = -1
    """The newest attempt seen (-1: none yet)."""
    dropped: int = 0
    """Chunks dropped: repeats and older attempts'."""
    cut_tokens: int = 0
    """Tokens cut from the answer when newer attempts took over."""
    behind: int = 0
    """Tokens the current attempt continues from that this reader never had."""
    final: TokenChunk | None = None
    """The chunk that ended the request (``finish_reason`` set), once it came."""
    _kept: list[TokenChunk] = field(default_factory=list)  # earlier attempts', after the cuts
    _current: dict[int, TokenChunk] = field(default_factory=dict)  # this attempt's, by index
    _holes: list[tuple[int, int]] = field(default_factory=list)  # earlier attempts' missed

    def take(self, chunk: TokenChunk) -> int | None:
        """Apply one chunk: None if it was dropped, else how many tokens of the answer so far it
        cut (0 but on the first chunk of a migrated attempt that found more than it continues
        from)."""
        if chunk.attempt < self.attempt or (
            chunk.attempt == self.attempt and chunk.index in self._current
        ):
            self.dropped += 1
            return None
        if chunk.attempt > self.attempt:
            self._holes += [(self.attempt, i) for i in self._gaps()]
            self._kept = self.chunks
            self._current = {}
            self.attempt = chunk.attempt
            self.behind = 0
            self.final = None
        cut = 0
        if chunk.index == 0 and chunk.generated_before is not None:
            cut = self._cut_to(chunk.generated_before)  # later chunks of it may have come first
        self._current[chunk.index] = chunk
        if chunk.finish_reason is not None:
            self.final = chunk
        return cut

    @property
    def chunks(self) -> list[TokenChunk]:
        """The answer's chunks, in order."""
        return self._kept + [self._current[i] for i in sorted(self._current)]

    @property
    def token_ids(self) -> list[int]:
        return [t for c in self.chunks for t in c.token_ids]

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.chunks)

    def missing(self) -> list[tuple[int, int]]:
        """The ``(attempt, index)`` of chunks never seen below the newest index of each attempt
        (the current attempt's first chunks too, while its index 0 has not come)."""
        return self._holes + [(self.attempt, i) for i in self._gaps()]

    def _gaps(self) -> list[int]:
        if not self._current:
            return []
        return [i for i in range(max(self._current)) if i not in self._current]

    def _cut_to(self, tokens: int) -> int:
        kept: list[TokenChunk] = []
        total = 0
        for chunk in self._kept:
            n = len(chunk.token_ids)
            if total + n <= tokens:
                kept.append(chunk)
                total += n
                continue
            if total < tokens:  # a cut inside a chunk: keep its first tokens, not its text
                k = tokens - total
                logprobs = chunk.logprobs[:k] if chunk.logprobs is not None else None
                head = msgspec.structs.replace(
                    chunk, token_ids=chunk.token_ids[:k], text="", logprobs=logprobs
                )
                kept.append(head)
                total = tokens
            break
        cut = sum(len(c.token_ids) for c in self._kept) - total
        self.behind = max(0, tokens - total)
        self._kept = kept
        self.cut_tokens += cut
        return cut
