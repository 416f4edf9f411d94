"""When discovery may expire workers: not while no worker at all is heard (the bucket's silence),
for at most max_deaf_s; after it each worker gets a full TTL from when heartbeats came again."""

from __future__ import annotations

from base.worker_watch import Hearing, expired
from schemas import WorkerRegistration
from tests.support.builders import registration


def reg(worker_id: str) -> WorkerRegistration:
    return registration(worker_id, ttl_s=4.0)


def test_one_silent_worker_among_beating_ones_expires_after_its_ttl() -> None:
    h = Hearing(max_deaf_s=30.0)
    h.heard(10.0)  # the other worker keeps beating
    assert h.may_expire(now=12.0, ttl_s=4.0)


def test_a_silence_of_every_worker_defers_expiry_up_to_the_bound() -> None:
    h = Hearing(max_deaf_s=30.0)
    h.heard(0.0)
    assert h.may_expire(now=2.0, ttl_s=4.0)  # beats a second apart: nothing unusual
    # nobody heard for most of a TTL: the bucket's fault, decided before the first worker is
    # due (their last beats land a few ms apart; one must not expire just before the rest)
    assert not h.may_expire(now=2.6, ttl_s=4.0)
    assert not h.may_expire(now=5.0, ttl_s=4.0)
    assert not h.may_expire(now=29.0, ttl_s=4.0)
    assert h.may_expire(now=31.0, ttl_s=4.0)  # past the bound: they are gone after all


def test_after_a_deaf_spell_each_worker_gets_a_full_ttl_from_when_beats_resume() -> None:
    h = Hearing()
    regs = {"a": reg("a"), "b": reg("b")}
    live = {"a": 0.0, "b": 0.0}  # when each was last heard
    h.heard(0.0)
    assert not h.may_expire(now=8.0, ttl_s=4.0)
    live["a"] = 8.0  # a's beat lands again, b's not yet
    h.heard(8.0)
    assert h.since == 8.0
    assert expired(live, regs, now=10.0, heard_since=h.since) == []  # b has until 12
    live["a"] = 11.0
    h.heard(11.0)
    assert expired(live, regs, now=12.5, heard_since=h.since) == ["b"]
    assert h.may_expire(now=12.5, ttl_s=4.0)


def test_a_worker_not_heard_for_its_ttl_or_without_a_registration_is_expired() -> None:
    regs = {"a": reg("a"), "b": reg("b")}
    live = {"a": 0.0, "b": 4.0, "c": 5.0}  # c's registration was deleted
    assert expired(live, regs, now=6.0) == ["a", "c"]
    assert expired(live, regs, now=4.0) == ["c"]  # a is due only past its 4 s
