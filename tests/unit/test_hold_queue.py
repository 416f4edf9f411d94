"""Requests held while every worker has a queue: let go by priority then arrival, for the room
the fleet state measures, a key without room not blocking another's; the fleet state's room and
saturation with held requests counted."""

from __future__ import annotations

import asyncio

from router.hold_queue import HoldKey, HoldQueue
from schemas import WorkerLoad
from tests.support.builders import fleet_state, registration

A: HoldKey = ("m", ("agg",), None)
B: HoldKey = ("n", ("agg",), None)


class _Waiter:
    def __init__(self, name: str, released: list[str]) -> None:
        self.name, self.released, self._done = name, released, False

    def done(self) -> bool:
        return self._done

    def set_result(self, result: None, /) -> None:
        self._done = True
        self.released.append(self.name)

    def cancel(self) -> None:
        self._done = True


def test_released_by_priority_then_arrival_for_the_room_there_is() -> None:
    q, out = HoldQueue(), []
    for name, priority in [("batch-1", 1), ("chat-1", 0), ("batch-2", 1), ("chat-2", 0)]:
        q.hold(A, priority, _Waiter(name, out))
    assert len(q) == 4
    assert q.release(lambda _k: 0) == 0 and out == []
    assert q.release(lambda _k: 3) == 3
    assert out == ["chat-1", "chat-2", "batch-1"]
    assert len(q) == 1 and q.pending[A] == 3
    # the room measured again before those let go are routed: not given twice
    assert q.release(lambda _k: 3) == 0
    q.routed(A)
    assert q.release(lambda _k: 3) == 1 and out[-1] == "batch-2"
    assert len(q) == 0


def test_a_key_without_room_does_not_hold_up_another() -> None:
    q, out = HoldQueue(), []
    q.hold(A, 0, _Waiter("a1", out))
    q.hold(B, 0, _Waiter("b1", out))
    q.hold(A, 0, _Waiter("a2", out))
    assert q.release(lambda k: 1 if k == B else 0) == 1
    assert out == ["b1"] and q.held[A] == 2 and B not in q.held


def test_a_request_whose_client_left_is_skipped() -> None:
    q, out = HoldQueue(), []
    gone = _Waiter("gone", out)
    q.hold(A, 0, gone)
    q.hold(A, 0, _Waiter("stays", out))
    gone.cancel()
    q.forget(A)
    assert len(q) == 1
    assert q.release(lambda _k: 1) == 1 and out == ["stays"]


def test_with_asyncio_futures() -> None:
    async def main() -> None:
        q = HoldQueue()
        f: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        q.hold(A, 0, f)
        q.release(lambda _k: 1)
        await asyncio.wait_for(f, 1)

    asyncio.run(main())


def _load(wid: str, running: int, waiting: int) -> WorkerLoad:
    return WorkerLoad(wid, "m", "agg", 0.0, running, waiting, 4, 0.0, 100)


def test_room_counts_what_waits_for_a_slot() -> None:
    st = fleet_state(registration("a", max_num_seqs=4), registration("b", max_num_seqs=4))
    assert st.room("m", ("agg",), None, 2) == 12  # nothing reported: 4 free slots + 2, each
    st.apply_load(_load("a", 4, 3), 0.0)  # three waiting (a full KV cache or no slot)
    assert st.workers["a"].queue_depth() == 3
    assert st.room("m", ("agg",), None, 2) == 6  # b's only
    st.apply_load(_load("b", 2, 0), 0.0)
    for _ in range(5):  # sent since b's report: 2 running + 5 > 4 slots, 3 wait
        st.count("b", +1)
    assert st.workers["b"].queue_depth() == 3
    assert st.room("m", ("agg",), None, 2) == 0
    st.apply_load(_load("a", 1, 1), 1.0)
    st.count("a", +1)  # a reported one waiting (its KV cache full): what is sent since waits
    assert st.workers["a"].queue_depth() == 2
    st.apply_load(_load("a", 1, 0), 2.0)  # none waiting: 3 free slots
    assert st.workers["a"].queue_depth() == -3


def test_saturation_counts_the_held_into_the_room_left() -> None:
    st = fleet_state(registration("a", max_num_seqs=2), registration("b", max_num_seqs=2))
    st.apply_load(_load("a", 2, 1), 0.0)  # room 2 + 3 - 3 = 2 under a bound of 3
    st.apply_load(_load("b", 2, 2), 0.0)  # room 1
    assert not st.saturated("m", "agg", 3)
    assert not st.saturated("m", "agg", 3, held=2)
    assert st.saturated("m", "agg", 3, held=3)


def test_a_report_too_old_is_not_trusted() -> None:
    """An idle worker reports once; a lost report must not keep a stale queue for ever."""
    st = fleet_state(registration("a", max_num_seqs=4))
    st.apply_load(_load("a", 4, 9), 10.0)
    assert st.room("m", ("agg",), None, 2, fresh_after=5.0) == 0
    assert st.room("m", ("agg",), None, 2, fresh_after=11.0) == 6  # what this router counts: 0


def test_requests_whose_clients_left_are_not_kept() -> None:
    q, out = HoldQueue(), []
    waiters = [_Waiter(str(i), out) for i in range(200)]
    for w in waiters:
        q.hold(A, 0, w)
    for w in waiters[:150]:
        w.cancel()
        q.forget(A)
    assert len(q) == 50 and len(q._heap) <= 2 * 50 + 64
    for w in waiters[150:]:
        w.cancel()
        q.forget(A)
    assert len(q) == 0 and q._heap == []
