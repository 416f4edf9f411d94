"""A request's token stream without servers: order, duplicates, gaps, notices, catch-up; and the
migration rule that follows an interrupted attempt."""

from __future__ import annotations

import pytest

from router.generation import Generation, Leg, NoWorkersError, migrated_request, next_attempt
from router.service import made_here
from router.token_stream import Interrupted, TokenStream
from schemas import Request, SamplingParams, TokenChunk


class Store:
    """``ChunkStore`` over a list of published chunks."""

    def __init__(self, chunks: list[TokenChunk] | None = None, broken: bool = False) -> None:
        self.chunks = chunks or []
        self.broken = broken
        self.reads: list[range] = []

    async def read(self, request_id: str, attempt: int, indices: range) -> list[TokenChunk] | None:
        self.reads.append(indices)
        found = [c for c in self.chunks if c.attempt == attempt and c.index in indices]
        return None if self.broken or len(found) < len(indices) else found

    async def last(self, request_id: str) -> TokenChunk | None:
        return self.chunks[-1] if self.chunks else None


def chunk(index: int, attempt: int = 0, final: bool = False) -> TokenChunk:
    return TokenChunk("r", attempt, index, (index,), finish_reason="stop" if final else None)


async def read(stream: TokenStream, n: int) -> list[tuple[int, int] | str]:
    out: list[tuple[int, int] | str] = []
    for _ in range(n):
        event = await stream.next()
        out.append(event.reason if isinstance(event, Interrupted) else (event.attempt, event.index))
    return out


async def test_chunks_come_out_in_order_once_and_of_the_current_attempt() -> None:
    stream = TokenStream("r", Store())
    for c in (chunk(0), chunk(0), chunk(1, attempt=1), chunk(1), chunk(0)):
        stream.feed(c)
    stream.feed(chunk(2, final=True))
    # the duplicates and the other attempt's chunk were dropped
    assert await read(stream, 3) == [(0, 0), (0, 1), (0, 2)]


async def test_a_gap_is_filled_from_the_store_before_the_chunk_after_it() -> None:
    store = Store([chunk(i) for i in range(5)])
    stream = TokenStream("r", store)
    stream.feed(chunk(0))
    stream.feed(chunk(4))
    assert await read(stream, 5) == [(0, i) for i in range(5)]
    assert store.reads == [range(1, 4)]
    assert stream.next_index == 5


async def test_chunks_the_store_cannot_give_back_interrupt_the_attempt() -> None:
    stream = TokenStream("r", Store(broken=True))
    stream.feed(chunk(2))
    assert await read(stream, 1) == ["lost token chunks"]


async def test_a_notice_about_an_attempt_left_behind_is_dropped() -> None:
    stream = TokenStream("r", Store())
    stream.interrupt("worker w1 left")
    assert await read(stream, 1) == ["worker w1 left"]
    stream.interrupt("stalled")  # queued about attempt 0 ...
    stream.begin_attempt(1)  # ... which the request has left
    stream.feed(chunk(0, attempt=0))
    stream.feed(chunk(0, attempt=1))
    assert await read(stream, 1) == [(1, 0)]


async def test_the_stall_clock_interrupts_once_per_timeout_and_not_after_the_end() -> None:
    stream = TokenStream("r", Store())
    start = stream.last_activity
    stream.check_stall(start + 0.5, timeout_s=1.0)
    assert not stream.pending
    stream.check_stall(start + 2.0, timeout_s=1.0)
    stream.check_stall(start + 2.5, timeout_s=1.0)  # the clock started again at 2.0
    assert await read(stream, 1) == ["stalled"] and not stream.pending
    stream.end()
    stream.check_stall(start + 10.0, timeout_s=1.0)
    stream.interrupt("worker w1 left")
    assert not stream.pending


async def test_a_worker_that_makes_progress_keeps_the_stall_clock_from_running() -> None:
    stream = TokenStream("r", Store())
    start = stream.last_activity
    stream.check_stall(start + 5.0, timeout_s=1.0, worker_progress_at=start + 4.5)
    assert not stream.pending  # queued behind others on a working engine: waiting
    stream.check_stall(start + 7.0, timeout_s=1.0, worker_progress_at=start + 4.5)
    assert await read(stream, 1) == ["stalled"]  # the engine stopped stepping too


async def test_a_stall_with_nowhere_to_go_is_waited_out_then_interrupted() -> None:
    """No other worker could take it: the stall is waited out ``patience`` times (the clock
    starting again each time), then interrupted all the same."""
    stream = TokenStream("r", Store())
    start = stream.last_activity
    asked: list[float] = []

    def nowhere() -> bool:
        asked.append(0.0)
        return False

    for k in (1, 2):  # each timeout in a row waited out
        assert stream.check_stall(start + 1.5 * k, 1.0, elsewhere=nowhere, patience=2)
        assert not stream.pending
    assert not stream.check_stall(start + 3.5, 1.0, elsewhere=nowhere, patience=2)  # clock: 3.0
    assert stream.check_stall(start + 4.5, 1.0, elsewhere=nowhere, patience=2)
    assert stream.pending and await read(stream, 1) == ["stalled"] and len(asked) == 2


async def test_progress_between_stalls_starts_the_patience_again() -> None:
    stream = TokenStream("r", Store())
    start = stream.last_activity

    def check(at: float, progress: float = 0.0) -> None:
        stream.check_stall(start + at, 1.0, progress, elsewhere=lambda: False, patience=1)

    check(1.5)  # waited out (1 of 1)
    check(3.0, progress=start + 2.0)  # the engine stepped at 2.0: no stall, the count restarts
    check(4.5, progress=start + 2.0)  # the first stall since: waited out again
    assert not stream.pending
    check(6.0, progress=start + 2.0)  # the second in a row: interrupted
    assert stream.pending and await read(stream, 1) == ["stalled"]


async def test_a_stall_with_another_worker_to_go_to_is_interrupted_at_once() -> None:
    stream = TokenStream("r", Store())
    start = stream.last_activity
    assert stream.check_stall(start + 1.5, 1.0, elsewhere=lambda: True, patience=3)
    assert stream.pending and await read(stream, 1) == ["stalled"]


async def test_catch_up_feeds_the_newest_stored_chunk_only_when_unseen() -> None:
    store = Store([chunk(0), chunk(1), chunk(2, final=True)])
    stream = TokenStream("r", store)
    stream.feed(chunk(0))
    assert await read(stream, 1) == [(0, 0)]
    await stream.catch_up()  # index 2 was missed: it comes, with the gap before it
    assert await read(stream, 2) == [(0, 1), (0, 2)]
    await stream.catch_up()  # seen already: nothing
    assert not stream.pending


REQ = Request("r", "m", (1, 2, 3), SamplingParams(max_tokens=4, min_tokens=2))


@pytest.mark.parametrize(
    ("request_", "generated", "max_attempts", "expected"),
    [
        (REQ, [7], 3, "next"),
        (REQ, [7], 1, "error: gave up after 1 attempts: stalled"),
        (REQ, [7, 8, 9, 10], 3, "length"),
        (
            migrated_request(REQ, 3, [7], remaining=3),  # attempt 1: 1 token was generated
            [7, 8, 9, 10],
            3,
            "length",
        ),
        (
            migrated_request(REQ, 3, [7], remaining=3),
            [7, 8],
            2,
            "error: gave up after 2 attempts: stalled",
        ),
    ],
)
def test_what_follows_an_interrupted_attempt(
    request_: Request, generated: list[int], max_attempts: int, expected: str
) -> None:
    nxt = next_attempt(request_, 3, generated, max_attempts, "stalled")
    if expected == "next":
        assert isinstance(nxt, Request)
        assert nxt == migrated_request(request_, 3, generated, remaining=3)
        assert (nxt.attempt, nxt.token_ids, nxt.sampling.min_tokens) == (1, (1, 2, 3, 7), 0)
    elif expected == "length":
        assert isinstance(nxt, TokenChunk) and nxt.finish_reason == "length" and nxt.error is None
    else:
        assert isinstance(nxt, TokenChunk) and nxt.finish_reason == "error"
        assert f"error: {nxt.error}" == expected


def test_a_prompt_of_embeddings_cannot_move_once_it_has_generated() -> None:
    embeds = Request("r", "m", (), SamplingParams(max_tokens=4), prompt_embeds=b"t")
    assert isinstance(next_attempt(embeds, 0, [], 3, "stalled"), Request)
    ended = next_attempt(embeds, 0, [5], 3, "stalled")
    assert isinstance(ended, TokenChunk) and "prompt_embeds" in (ended.error or "")


class NoneLeft:
    """``Dispatch`` with nowhere to move a request: routing raises ``NoWorkersError``."""

    async def route(self, request: Request, exclude: object, leg: object) -> object:
        raise NoWorkersError("no worker left")

    async def publish(self, request: Request, subject: str, traceparent: str | None) -> None:
        raise AssertionError("nothing to publish")

    async def cancel(self, request_id: str, reason: str) -> None:
        pass

    def moved(self, from_worker: str, to_worker: str, leg: object) -> None:
        pass

    def first_token(self, request_id: str) -> None:
        pass

    async def release(self, request_id: str, worker_id: str) -> None:
        pass


async def test_a_new_attempt_that_cannot_start_says_what_it_continued_from() -> None:
    stream = TokenStream("r", Store())
    gen = Generation(NoneLeft(), REQ, None, stream, Leg("agg", ("agg",), 3, 60.0))  # type: ignore[arg-type]
    stream.published()
    stream.feed(TokenChunk("r", 0, 0, (7, 8), worker_id="w1"))
    stream.interrupt("stalled")
    out = [c async for c in gen]
    assert [c.token_ids for c in out[:-1]] == [(7, 8)]
    end = out[-1]
    assert (end.attempt, end.index, end.finish_reason) == (1, 0, "error")
    assert end.generated_before == 2  # a NATS reader cuts the old attempt's later chunks
    assert made_here(end)  # the router service publishes it for its NATS clients


def test_the_router_service_publishes_the_final_chunks_the_routing_library_makes() -> None:
    budget_spent = next_attempt(REQ, 3, [7, 8, 9, 10], 3, "stalled")
    assert isinstance(budget_spent, TokenChunk) and budget_spent.finish_reason == "length"
    assert made_here(budget_spent)  # a NATS-only client waits for it: it must be published
    assert not made_here(TokenChunk("r", 0, 3, (5,), finish_reason="stop", worker_id="w1"))
    assert not made_here(TokenChunk("r", 0, 3, (5,)))
