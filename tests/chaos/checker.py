"""The checker, as Jepsen's: a history of requests in, a verdict per fault out.

Every request the load generators send is recorded as a ``Trace``: when it was sent, whether the
fleet accepted it (an HTTP stream that began: status 200 and its headers; a NATS submit that
JetStream acknowledged), every piece of output with its arrival time, and how it ended. The
mocker's output is a pure function of the request's seed and each token's position, so each
seed's full, undisturbed answer (``references``, taken before any fault) is what every request
with that seed must show, whatever migrations it went through.

Verdicts for an accepted request (exactly one):
- ``completed``: it ended once, with a finish reason, and its output equals the reference;
- ``clear error``: it ended once with an error the client can read (an SSE error event, an error
  chunk);
- ``duplicated``: it ended "complete" with an output as long as the reference or longer but not
  equal to it (tokens repeated, spliced or reordered), or its token stream carried chunks of an
  older attempt after a newer one (``interleaved``, in the stream's own order, see
  ``attempts_interleaved``);
- ``lost``: it never ended within the bound, or it ended without a final chunk or error (a
  stream cut off), or with fewer tokens than the reference (a truncated answer).
A request that was not accepted (a 503, a refused connection, an unacknowledged submit) is a
``refused``: a clear error by construction, counted apart.

``longest stall``: the longest wait between two consecutive signs of life of one accepted request
(acceptance, each piece of output, its end).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

Verdict = str  # "completed" | "clear_error" | "duplicated" | "lost" | "refused"


@dataclass
class Trace:
    request_id: str
    kind: str  # "http" | "nats"
    seed: int
    sent_at: float
    accepted_at: float = 0.0  # 0.0: never accepted
    arrivals: list[float] = field(default_factory=list)
    output: list[object] = field(default_factory=list)  # text pieces (http) or token ids (nats)
    ended_at: float = 0.0  # 0.0: never ended
    end: str = ""  # "finish:<reason>" | "error:<message>" | "cut:<what>" | "refused:<why>"
    interleaved: bool = False  # its token stream carried an older attempt after a newer one

    @property
    def accepted(self) -> bool:
        return self.accepted_at > 0.0

    def stall(self, now: float) -> float:
        if not self.accepted:
            return 0.0
        marks = [self.accepted_at, *self.arrivals, self.ended_at or now]
        return max((b - a for a, b in itertools.pairwise(marks)), default=0.0)


def verdict(trace: Trace, reference: Sequence[object] | None) -> Verdict:
    if not trace.accepted:
        return "refused"
    if not trace.ended_at or trace.end.startswith("cut:"):
        return "lost"
    if trace.end.startswith("error:"):
        return "clear_error"
    if trace.interleaved:
        return "duplicated"
    out = _joined(trace)
    ref = _joined_ref(trace, reference)
    if out == ref:
        return "completed"
    # as long or longer: tokens repeated or spliced in; shorter: tokens missing
    return "duplicated" if _length(trace, out) >= _length(trace, ref) else "lost"


def _length(trace: Trace, joined: str) -> int:
    return len(joined) if trace.kind == "http" else len(joined.split(",")) if joined else 0


def _joined(trace: Trace) -> str:
    if trace.kind == "http":
        return "".join(str(p) for p in trace.output)
    return ",".join(str(t) for t in trace.output)


def _joined_ref(trace: Trace, reference: Sequence[object] | None) -> str:
    if reference is None:
        return ""
    if trace.kind == "http":
        return "".join(str(p) for p in reference)
    return ",".join(str(t) for t in reference)


def attempts_interleaved(chunks: Iterable[tuple[str, int]]) -> set[str]:
    """Request ids whose chunks, in the token stream's order, show an attempt lower than one
    already seen: a worker publishing into a stream that moved on."""
    highest: dict[str, int] = {}
    bad = set()
    for request_id, attempt in chunks:
        if attempt < highest.get(request_id, 0):
            bad.add(request_id)
        highest[request_id] = max(highest.get(request_id, 0), attempt)
    return bad


@dataclass(frozen=True)
class Row:
    fault: str
    requests: int
    accepted: int
    completed: int
    clear_errors: int  # accepted and ended with an error, plus refused before acceptance
    refused: int
    lost: int
    duplicated: int
    longest_stall_s: float

    def line(self) -> str:
        return (
            f"{self.fault:<34} {self.requests:>8} {self.accepted:>8} {self.completed:>9} "
            f"{self.clear_errors:>6} {self.refused:>7} {self.lost:>5} {self.duplicated:>5} "
            f"{self.longest_stall_s:>9.1f}"
        )


HEADER = (
    f"{'fault':<34} {'requests':>8} {'accepted':>8} {'completed':>9} {'errors':>6} "
    f"{'refused':>7} {'lost':>5} {'dup':>5} {'stall (s)':>9}"
)


def judge(
    fault: str,
    traces: Sequence[Trace],
    references: dict[tuple[str, int], Sequence[object]],
    now: float,
) -> tuple[Row, dict[Verdict, list[Trace]]]:
    by: dict[Verdict, list[Trace]] = {}
    for t in traces:
        by.setdefault(verdict(t, references.get((t.kind, t.seed))), []).append(t)
    count = {k: len(v) for k, v in by.items()}
    row = Row(
        fault=fault,
        requests=len(traces),
        accepted=sum(t.accepted for t in traces),
        completed=count.get("completed", 0),
        clear_errors=count.get("clear_error", 0) + count.get("refused", 0),
        refused=count.get("refused", 0),
        lost=count.get("lost", 0),
        duplicated=count.get("duplicated", 0),
        longest_stall_s=max((t.stall(now) for t in traces), default=0.0),
    )
    return row, by


def table(rows: Sequence[Row]) -> str:
    return "\n".join([HEADER, *(r.line() for r in rows)])
