"""The reading rule of a token stream, over the interleavings a NATS client meets."""

from __future__ import annotations

from schemas.token_reader import TokenReader
from schemas.tokens import TokenChunk, TokenLogprob


def chunk(attempt: int, index: int, *tokens: int, before: int | None = None, end: bool = False):
    return TokenChunk(
        "r", attempt, index, token_ids=tokens, text="".join(chr(96 + t) for t in tokens),
        finish_reason="length" if end else None, generated_before=before,
    )  # fmt: skip


def read(*chunks: TokenChunk) -> TokenReader:
    reader = TokenReader()
    for c in chunks:
        reader.take(c)
    return reader


def test_chunks_in_order_make_the_answer():
    r = read(chunk(0, 0, 1), chunk(0, 1, 2, 3), chunk(0, 2, 4, end=True))
    assert (r.token_ids, r.text, r.dropped) == ([1, 2, 3, 4], "abcd", 0)
    assert r.final is not None and r.final.index == 2


def test_repeats_are_dropped():
    r = read(chunk(0, 0, 1), chunk(0, 1, 2), chunk(0, 0, 1), chunk(0, 1, 2), chunk(0, 2, 3))
    assert (r.token_ids, r.dropped) == ([1, 2, 3], 2)


def test_an_older_attempts_chunk_after_a_newer_ones_is_dropped():
    # the old worker was paused with chunk 2 in its client; it came after the migration
    r = read(
        chunk(0, 0, 1), chunk(0, 1, 2), chunk(1, 0, 3, before=2), chunk(0, 2, 9), chunk(1, 1, 4)
    )
    assert (r.token_ids, r.dropped, r.cut_tokens) == ([1, 2, 3, 4], 1, 0)


def test_an_older_attempts_chunk_its_router_had_not_seen_is_cut_by_the_newer_attempt():
    # the router migrated after 2 tokens; the old worker's third came before attempt 1's first
    reader = TokenReader()
    for c in (chunk(0, 0, 1), chunk(0, 1, 2), chunk(0, 2, 9)):
        assert reader.take(c) == 0
    assert reader.take(chunk(1, 0, 3, before=2)) == 1
    reader.take(chunk(1, 1, 4, end=True))
    assert (reader.token_ids, reader.text, reader.cut_tokens) == ([1, 2, 3, 4], "abcd", 1)
    assert reader.final is not None and reader.final.attempt == 1


def test_a_migration_from_nothing_cuts_everything_and_one_without_a_count_cuts_nothing():
    assert read(chunk(0, 0, 1), chunk(1, 0, 5, before=0)).token_ids == [5]
    # an error chunk made by a router, or a worker that predates the field: no count, no cut
    assert read(chunk(0, 0, 1), chunk(1, 0, 5)).token_ids == [1, 5]


def test_a_cut_inside_a_chunk_keeps_its_first_tokens_and_their_logprobs():
    lp = tuple(TokenLogprob(-float(i)) for i in range(3))
    first = TokenChunk("r", 0, 0, token_ids=(1, 2, 3), text="abc", logprobs=lp)
    r = read(first, chunk(1, 0, 7, before=2))
    assert r.token_ids == [1, 2, 7] and r.text == "g"  # the split chunk's text is lost
    assert r.chunks[0].logprobs == lp[:2]


def test_what_the_reader_missed_is_told_not_invented():
    # it missed attempt 0's chunk 1 (disconnected): the stream holds it
    r = read(chunk(0, 0, 1), chunk(0, 2, 3))
    assert r.missing() == [(0, 1)] and r.token_ids == [1, 3]
    assert read(chunk(0, 0, 1), chunk(0, 2, 3), chunk(0, 1, 2)).token_ids == [1, 2, 3]
    late = read(chunk(0, 0, 1), chunk(1, 0, 4, before=3))  # attempt 1 continues from 3 tokens
    assert late.behind == 2 and late.cut_tokens == 0
    # a hole in the old attempt stays on the list after the move: the cut counted without it
    moved = read(chunk(0, 0, 1), chunk(0, 2, 3), chunk(0, 3, 9), chunk(1, 0, 4, before=3))
    assert moved.missing() == [(0, 1)]
    assert read(chunk(0, 0, 1), chunk(1, 0, 4, before=1), chunk(1, 1, 5)).missing() == []


def test_the_cut_waits_for_the_new_attempts_first_chunk_whatever_comes_before_it():
    # attempt 1's chunk 1 came before its chunk 0 (read back from the stream later)
    r = read(chunk(0, 0, 1), chunk(0, 1, 2), chunk(0, 2, 9), chunk(1, 1, 4))
    assert r.missing() == [(1, 0)]
    assert r.take(chunk(1, 0, 3, before=2)) == 1
    assert (r.token_ids, r.missing()) == ([1, 2, 3, 4], [])


def test_an_old_attempts_final_chunk_ends_the_answer_until_the_new_attempt_shows():
    r = read(chunk(0, 0, 1), chunk(0, 1, 2, end=True))  # it finished while being moved
    assert r.final is not None and r.final.attempt == 0 and r.token_ids == [1, 2]
    r.take(chunk(1, 0, 2, before=1))
    assert r.final is None and r.token_ids == [1, 2]
    r.take(chunk(1, 1, end=True))
    assert r.final is not None and r.final.attempt == 1
