"""The shared consumer rules (``base.consume``) over fakes: the pull loop's timeouts, back-off and
stop; dead letters for what does not decode or is invalid, the consumer going on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from prometheus_client import CollectorRegistry

from base import consume
from base.consume import DeadLetters, Fetch, pull_loop, until
from base.deadletter import DeadLetterMetrics
from schemas import DeadLetter, Request, SamplingParams, Subjects, TokenChunk, decode, encode


class FakePull:
    """A pull subscription whose fetches answer from a script: a list of messages or an
    exception each."""

    def __init__(self, *script: Any) -> None:
        self.script = list(script)
        self.fetches: list[tuple[int, float]] = []

    async def fetch(self, batch: int, timeout: float) -> list[Any]:
        self.fetches.append((batch, timeout))
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        return list(step)


class FakeMsg:
    def __init__(
        self, data: bytes, subject: str = "fleet.req.m.pool.agg", term_fails: bool = False
    ):
        self.data = data
        self.subject = subject
        self.headers: dict[str, str] = {}
        self.terms = 0
        self.term_fails = term_fails

    async def term(self) -> None:
        self.terms += 1
        if self.term_fails:
            raise RuntimeError("connection closed")


class FakeNats:
    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, payload: bytes) -> None:
        self.published.append((subject, payload))


def fetches(n: int, fetch: Fetch) -> Any:
    """``next_fetch`` answering ``fetch`` ``n`` times, then None."""
    left = [fetch] * n

    async def next_fetch() -> Fetch | None:
        return left.pop() if left else None

    return next_fetch


async def test_the_loop_hands_every_message_over_in_order_through_timeouts() -> None:
    pull = FakePull(["a", "b"], NatsTimeoutError(), TimeoutError(), ["c"])
    handled: list[str] = []

    async def handle(msg: Any) -> None:
        handled.append(msg)

    await pull_loop(pull, fetches(4, Fetch(8, 0.25)), handle)  # type: ignore[arg-type]
    assert handled == ["a", "b", "c"]
    assert pull.fetches == [(8, 0.25)] * 4


async def test_what_a_fetch_returns_beyond_its_batch_is_naked_not_handled() -> None:
    class Nakable:
        def __init__(self, name: str) -> None:
            self.name, self.naks = name, 0

        async def nak(self) -> None:
            self.naks += 1

    a, b, c = Nakable("a"), Nakable("b"), Nakable("c")
    pull = FakePull([a, b, c])
    handled: list[Any] = []

    async def handle(msg: Any) -> None:
        handled.append(msg)

    await pull_loop(pull, fetches(1, Fetch(1)), handle)  # type: ignore[arg-type]
    assert handled == [a]  # a worker with one free slot starts one
    assert (a.naks, b.naks, c.naks) == (0, 1, 1)


async def test_a_failed_fetch_backs_off_and_the_loop_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(s: float) -> None:
        slept.append(s)
        await real_sleep(0)

    monkeypatch.setattr(consume.asyncio, "sleep", sleep)
    pull = FakePull(ConnectionError("reconnecting"), ["a"])
    handled: list[str] = []

    async def handle(msg: Any) -> None:
        handled.append(msg)

    await pull_loop(pull, fetches(2, Fetch(1)), handle)  # type: ignore[arg-type]
    assert handled == ["a"] and slept == [consume.FETCH_BACKOFF_S]


async def test_until_fetches_its_batch_until_the_stop_event() -> None:
    stop = asyncio.Event()
    next_fetch = until(stop, 64)
    assert await next_fetch() == Fetch(64, 1.0)
    stop.set()
    assert await next_fetch() is None


def _letters(nc: FakeNats) -> DeadLetters:
    return DeadLetters(nc, Subjects("t"), "worker")  # type: ignore[arg-type]


async def test_an_undecodable_message_is_dead_lettered_and_terminated() -> None:
    nc = FakeNats()
    msg = FakeMsg(b"\xc1 not msgpack")
    assert await _letters(nc).decoded(msg, Request) is None  # type: ignore[arg-type]
    [(subject, payload)] = nc.published
    letter = decode(payload, DeadLetter)
    assert subject == Subjects("t").dlq("worker") and letter.payload == msg.data
    assert letter.component == "worker" and letter.subject == msg.subject
    assert msg.terms == 1


async def test_a_core_nats_message_is_only_recorded_and_a_failed_term_is_swallowed() -> None:
    nc = FakeNats()
    core = FakeMsg(b"junk")
    assert await _letters(nc).decoded(core, Request, terminate=False) is None  # type: ignore[arg-type]
    assert core.terms == 0 and len(nc.published) == 1
    closing = FakeMsg(b"junk", term_fails=True)
    await _letters(nc).refuse(closing, "why")  # type: ignore[arg-type]
    assert closing.terms == 1 and len(nc.published) == 2


class FailingNats:
    async def publish(self, subject: str, payload: bytes) -> None:
        raise ConnectionError("nats down")


async def test_every_dead_letter_is_counted_by_component_even_when_its_publish_fails() -> None:
    registry = CollectorRegistry()
    metrics = DeadLetterMetrics(registry)
    ok = DeadLetters(FakeNats(), Subjects("t"), "router", metrics)  # type: ignore[arg-type]
    assert registry.get_sample_value("jetfleet_dead_letters_total", {"component": "router"}) == 0
    down = DeadLetters(FailingNats(), Subjects("t"), "router", metrics)  # type: ignore[arg-type]
    await ok.refuse(FakeMsg(b"junk"), "undecodable")  # type: ignore[arg-type]
    await down.record(FakeMsg(b"junk"), "undecodable")  # type: ignore[arg-type]
    assert registry.get_sample_value("jetfleet_dead_letters_total", {"component": "router"}) == 2
    req = Request("r1", "m", (1, 2), SamplingParams(max_tokens=2))
    assert await ok.decoded(FakeMsg(encode(req)), Request) == req  # type: ignore[arg-type]
    assert registry.get_sample_value("jetfleet_dead_letters_total", {"component": "router"}) == 2


async def test_a_decodable_message_comes_back_and_nothing_is_published() -> None:
    nc = FakeNats()
    req = Request("r1", "m", (1, 2), SamplingParams(max_tokens=2))
    assert await _letters(nc).decoded(FakeMsg(encode(req)), Request) == req  # type: ignore[arg-type]
    assert nc.published == []


@pytest.mark.parametrize(("request_id", "told"), [("r-1", True), ("bad.id with space", False)])
async def test_an_invalid_request_is_refused_and_its_client_told_when_it_can_be(
    request_id: str, told: bool
) -> None:
    nc = FakeNats()
    req = Request(request_id, "m", (1,), SamplingParams(max_tokens=0), attempt=2)
    msg = FakeMsg(encode(req))
    await _letters(nc).refuse_request(msg, req, "max_tokens must be >= 1", "w1")  # type: ignore[arg-type]
    letter = decode(nc.published[0][1], DeadLetter)
    assert letter.reason == "invalid request: max_tokens must be >= 1" and msg.terms == 1
    chunks = [(s, decode(p, TokenChunk)) for s, p in nc.published[1:]]
    if not told:
        assert chunks == []
        return
    [(subject, chunk)] = chunks
    assert subject == Subjects("t").tok(request_id)
    assert (chunk.finish_reason, chunk.attempt, chunk.index, chunk.worker_id) == (
        "error", 2, 0, "w1"
    )  # fmt: skip
    assert chunk.error == letter.reason
