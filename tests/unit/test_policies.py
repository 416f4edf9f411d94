from collections import Counter

import pytest

from router.policies import LeastLoaded, RandomChoice, RoundRobin, RouteQuery, make_policy
from schemas import WorkerLoad
from tests.support.builders import fleet_state, registration


def load(wid: str, running: int, waiting: int = 0) -> WorkerLoad:
    return WorkerLoad(
        worker_id=wid,
        model="m",
        role="agg",
        ts_s=0.0,
        num_running=running,
        num_waiting=waiting,
        max_num_seqs=8,
        kv_usage=0.0,
        num_gpu_blocks=100,
    )


Q = RouteQuery("m", 10)


def test_round_robin_cycles_in_worker_order():
    st = fleet_state(registration("b"), registration("a"), registration("c"))
    rr = RoundRobin()
    picks = [rr.choose(Q, st.candidates("m")).worker_id for _ in range(6)]
    assert picks == ["a", "b", "c", "a", "b", "c"]


def test_candidates_filter_model_role_status_and_exclusions():
    st = fleet_state(
        registration("a"),
        registration("b", model="other"),
        registration("c", role="prefill"),
        registration("d", status="draining"),
        registration("e"),
    )
    assert {v.worker_id for v in st.candidates("m")} == {"a", "e"}
    assert {v.worker_id for v in st.candidates("m", exclude=["a"])} == {"e"}


def test_least_loaded_uses_larger_of_report_and_local_count():
    st = fleet_state(registration("a"), registration("b"))
    st.apply_load(load("a", running=1), 0.0)
    st.workers["b"].in_flight = 3  # our own count beats b's (missing) report
    d = LeastLoaded(seed=1).choose(Q, st.candidates("m"))
    assert d.worker_id == "a"
    costs = {c.worker_id: c.cost for c in d.candidates}
    assert costs == {"a": 1 / 8, "b": 3 / 8}


def test_least_loaded_breaks_ties_randomly_but_seeded():
    st = fleet_state(registration("a"), registration("b"), registration("c"))
    p = LeastLoaded(seed=3)
    seq1 = [p.choose(Q, st.candidates("m")).worker_id for _ in range(20)]
    p = LeastLoaded(seed=3)
    seq2 = [p.choose(Q, st.candidates("m")).worker_id for _ in range(20)]
    assert seq1 == seq2 and len(set(seq1)) > 1


def test_random_is_seeded_and_spreads():
    st = fleet_state(registration("a"), registration("b"))
    p1, p2 = RandomChoice(seed=5), RandomChoice(seed=5)
    seq1 = [p1.choose(Q, st.candidates("m")).worker_id for _ in range(200)]
    seq2 = [p2.choose(Q, st.candidates("m")).worker_id for _ in range(200)]
    picks = Counter(seq1)
    assert set(picks) == {"a", "b"} and min(picks.values()) > 60
    assert seq1 == seq2


def test_saturation_needs_every_worker_past_the_bound():
    st = fleet_state(registration("a", max_num_seqs=2), registration("b", max_num_seqs=2))
    st.apply_load(load("a", running=2, waiting=1), 0.0)
    assert not st.saturated("m", "agg", max_waiting_per_worker=1)
    st.apply_load(load("b", running=2, waiting=5), 0.0)
    assert st.saturated("m", "agg", max_waiting_per_worker=1)
    assert not st.saturated("m", "agg", max_waiting_per_worker=10)


def test_make_policy_rejects_unknown_names():
    assert make_policy("pool") is None
    with pytest.raises(ValueError, match="unknown routing policy"):
        make_policy("nope")


@pytest.mark.parametrize(
    ("name", "cls"),
    [("round-robin", RoundRobin), ("random", RandomChoice), ("least-loaded", LeastLoaded)],
)
async def test_each_name_builds_its_policy_and_decisions_say_which(name: str, cls: type) -> None:
    from router.policies import LocalRouter

    st = fleet_state(registration("a"), registration("b"))
    st.apply_load(load("a", running=2, waiting=1), 0.0)
    policy = make_policy(name, seed=5)
    assert type(policy) is cls and policy.name == name
    router = LocalRouter(policy)
    assert router.name == name
    d = await router.route(Q, st.candidates("m"))
    assert d.policy == name and d.worker_id in {"a", "b"}
    assert 0.0 < d.decision_us < 1e5  # microseconds of one decision, measured
    if name == "least-loaded":  # the candidates carry the loads the choice was made on
        assert {c.worker_id: c.load for c in d.candidates} == {"a": 3.0, "b": 0.0}
        assert d.worker_id == "b"


def test_the_seed_reaches_the_random_policies() -> None:
    st = fleet_state(*(registration(w) for w in "abcdefgh"))

    def picks(name: str, seed: int) -> tuple[str, ...]:
        policy = make_policy(name, seed=seed)
        assert policy is not None
        return tuple(policy.choose(Q, st.candidates("m")).worker_id for _ in range(12))

    for name in ("random", "least-loaded"):
        assert picks(name, 11) == picks(name, 11)  # the same seed, the same choices
        assert len({picks(name, s) for s in range(6)}) > 1  # different seeds: the seed is used


def test_kv_names_are_refused_here_with_where_to_go() -> None:
    for name in ("kv", "approx"):
        with pytest.raises(
            ValueError, match=r"is a KV-aware router: use router\.routers\.build_router"
        ):
            make_policy(name)
    with pytest.raises(ValueError, match="choose from kv, round-robin, random, least-loaded, "):
        make_policy("fastest")  # every choice named, comma-separated


@pytest.mark.parametrize(
    ("costs", "temperature", "rand", "winner"),
    [
        ([3.0, 1.0, 1.0], 0.0, 0.0, 1),  # ties: rand picks among the cheapest
        ([3.0, 1.0, 1.0], 0.0, 0.99, 2),
        ([1.0, 1.0], 0.0, 1.0, 1),  # rand at its top end stays in range
        ([0.0, 8.0], 8.0, 0.72, 0),  # weights 1 and e^-1: 0 holds 73.1%
        ([0.0, 8.0], 8.0, 0.74, 1),
        ([2.0, 10.0], 8.0, 0.72, 0),  # shifted by the best: the same split
        ([0.0, 0.8], 0.5, 0.82, 0),  # weights 1 and e^-1.6 (0.2019): 0 holds 83.2%
        ([0.0, 0.8], 0.5, 0.84, 1),
        ([0.0, 0.0, 0.0], 1.0, 1 / 3, 1),  # exactly at a boundary: the next one
        ([0.0, 0.0], 1.0, 1.0, 1),  # rand 1.0: the last, never past it
        ([0.0, 40.0], 8.0, 0.999, 0),  # 5 temperatures worse (e^-5, 0.67%): never drawn
        ([0.0, 32.0], 8.0, 0.99, 1),  # 4 temperatures: still drawn (e^-4, 1.8%)
        ([40.0, 0.0, 4.0], 8.0, 1.0, 2),  # rand 1.0: the last one drawable
    ],
)
def test_pick_follows_the_softmax_over_costs(
    costs: list[float], temperature: float, rand: float, winner: int
) -> None:
    from router.kv.routing import pick

    assert pick(costs, temperature, rand) == winner
