"""Stored and background responses across frontends, with the official openai client: a response
made through one frontend is read, listed, continued, cancelled and resumed through another; a
background response whose frontend is killed is finished by the other."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from base.ports import free_port
from schemas import Subjects
from tests.support.clients import openai_client
from tests.support.fleet import Fleet
from tests.support.wait import wait_for, wait_until

pytestmark = pytest.mark.integration
MODEL = "jetfleet-tiny"


@pytest.fixture(scope="module")
def two(nats_server, tmp_path_factory) -> Iterator[tuple[Fleet, openai.OpenAI, openai.OpenAI]]:
    """One mocker worker in real time (so a long answer is still running when a test acts on
    it) and two frontends."""
    f = Fleet(nats_server.url, tmp_path_factory.mktemp("responses"), worker_args=("--speedup", "4"))
    try:
        f.add_worker()
        a = f.start_frontend("--router", "round-robin")
        b = f.start_frontend("--router", "round-robin", name="frontend-b", port=free_port())
        yield f, openai_client(a), openai_client(b)
    finally:
        f.stop()


def test_a_stored_response_is_read_listed_continued_and_deleted_anywhere(two):
    _, a, b = two
    first = a.responses.create(
        model=MODEL, input="Name a colour.", instructions="Be brief.", max_output_tokens=12
    )
    assert first.store is True and first.status == "incomplete"  # cut at max_output_tokens
    got = b.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text
    items = b.responses.input_items.list(first.id)
    assert [i.type for i in items.data] == ["message"]
    assert items.data[0].content[0].text == "Name a colour."

    second = b.responses.create(
        model=MODEL,
        input="And another?",
        instructions="Be brief.",  # instructions are not carried over (as in OpenAI's API)
        previous_response_id=first.id,
        max_output_tokens=8,
    )
    assert second.previous_response_id == first.id
    # its prompt is the first turn (input, answer) and the new input; the first turn's prompt
    # is cached on the worker
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0

    b.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        a.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        a.responses.create(model=MODEL, input="x", previous_response_id=first.id)

    unstored = a.responses.create(model=MODEL, input="Hi", store=False, max_output_tokens=4)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        b.responses.retrieve(unstored.id)


def test_a_background_response_is_polled_to_completion_on_another_frontend(two):
    _, a, b = two
    queued = a.responses.create(model=MODEL, input="Hello", background=True, max_output_tokens=24)
    assert queued.status == "queued" and queued.background is True and queued.output == []

    def done() -> Any:
        r = b.responses.retrieve(queued.id)
        return r if r.status in ("completed", "incomplete", "failed") else None

    final = wait_until(done, 60, "background response finished")
    assert final.status == "incomplete" and final.usage.output_tokens == 24
    assert final.output_text


async def _tokens_published(f: Fleet, engine_request_id: str) -> int:
    """How many token chunks the worker has published for the request (FLEET_TOKENS)."""
    from base.connect import connect_nats

    s = Subjects(f.prefix)
    nc = await connect_nats(f.nats_url, name="test-tokens")
    try:
        info = await nc.jetstream().stream_info(
            s.stream_name("TOKENS"), subjects_filter=s.tok(engine_request_id)
        )
        return sum((info.state.subjects or {}).values())
    finally:
        await nc.close()


async def test_a_background_response_is_cancelled_from_another_frontend(two):
    f, a, b = two
    # 8,000 tokens take ~12 s at this speed: the cancel (~0.1 s) lands while it runs, even
    # on a loaded CI machine (3,000 tokens, ~5 s, once ended first there)
    r = a.responses.create(model=MODEL, input="Go on", background=True, max_output_tokens=8000)
    engine_request_id = "resp-" + r.id.removeprefix("resp_")
    await wait_for(lambda: _tokens_published(f, engine_request_id), timeout=30)
    cancelled = b.responses.cancel(r.id)
    assert cancelled.status == "cancelled"
    assert a.responses.retrieve(r.id).status == "cancelled"
    # the worker stopped: nothing more is published for it
    n = await _tokens_published(f, engine_request_id)
    await asyncio.sleep(1.0)  # a stopped stream stays stopped (a second of real-time tokens)
    assert await _tokens_published(f, engine_request_id) == n
    with pytest.raises(openai.BadRequestError, match="background"):
        b.responses.cancel(a.responses.create(model=MODEL, input="x", max_output_tokens=2).id)


def _events(stream: Any, n: int | None = None) -> list[Any]:
    out = []
    for event in stream:
        out.append(event)
        if n is not None and len(out) == n:
            break
    stream.close()
    return out


def _text(events: list[Any]) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def test_a_background_stream_dropped_and_resumed_elsewhere_has_no_gap_or_repeat(two):
    _, a, b = two
    args: dict[str, Any] = {
        "model": MODEL,
        "input": "Tell a story",
        "background": True,
        "stream": True,
        "max_output_tokens": 200,
        "extra_body": {"seed": 11},
    }
    head = _events(a.responses.create(**args), 6)
    rid = head[0].response.id
    tail = _events(b.responses.retrieve(rid, stream=True, starting_after=head[-1].sequence_number))
    whole = _events(b.responses.retrieve(rid, stream=True))  # from the start, uninterrupted
    resumed = head + tail
    assert [e.sequence_number for e in resumed] == list(range(len(resumed)))
    assert [e.model_dump() for e in resumed] == [e.model_dump() for e in whole]
    assert resumed[-1].type == "response.incomplete"
    assert (
        _text(resumed) == resumed[-1].response.output_text == b.responses.retrieve(rid).output_text
    )
    # after the end: nothing more, and the stream ends
    assert _events(b.responses.retrieve(rid, stream=True, starting_after=len(whole) - 1)) == []


def test_a_background_response_survives_the_death_of_its_frontend(two):
    """The frontend running a seeded background stream is SIGKILLed midway: the other takes it
    over, and the events (read across the kill and resumed) are the ones of the same request
    run undisturbed, with no gap or repeat."""
    f, _, b = two
    # a short lease (2 s) and an answer that outlasts it (3,000 tokens, ~5 s): the taker finds
    # the first attempt still generating, stops it and continues from what it published
    url = f.start_frontend(
        "--router", "round-robin", "--takeover-lease", "2",
        name="frontend-doomed", port=free_port(),
    )  # fmt: skip
    doomed = openai_client(url)
    args: dict[str, Any] = {
        "model": MODEL,
        "input": "Tell a long story",
        "background": True,
        "stream": True,
        "max_output_tokens": 3000,
        "extra_body": {"seed": 23},
    }
    head = _events(doomed.responses.create(**args), 12)
    rid = head[0].response.id
    f.group.children["frontend-doomed"].proc.send_signal(signal.SIGKILL)
    tail = _events(b.responses.retrieve(rid, stream=True, starting_after=head[-1].sequence_number))
    resumed = head + tail
    assert [e.sequence_number for e in resumed] == list(range(len(resumed)))
    assert resumed[-1].type == "response.incomplete"
    assert resumed[-1].response.usage.output_tokens == 3000
    taker = [n for n in ("frontend", "frontend-b") if "background_response_taking_over" in f.log(n)]
    assert len(taker) == 1, taker  # one of the two others took it over
    calm = _events(b.responses.create(**args))  # the same request, undisturbed
    assert _text(resumed) == _text(calm) == resumed[-1].response.output_text
    assert _kinds(resumed) == _kinds(calm)


def _kinds(events: list[Any]) -> list[str]:
    """The events' types, a run of text deltas as one (how the tokens came in chunks is the
    worker's timing)."""
    out: list[str] = []
    for e in events:
        if not (out and e.type == out[-1] == "response.output_text.delta"):
            out.append(e.type)
    return out
