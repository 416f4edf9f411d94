"""Subject building (``schemas.subjects``) and which stream captures which subject."""

from __future__ import annotations

import pytest

from schemas import DEFAULT_PREFIX, Subjects, model_token
from schemas.streams import fleet_topology, pool_consumer, router_consumer

S = Subjects()


def _matches(pattern: str, subject: str) -> bool:
    """NATS wildcard match: ``*`` is one token, a trailing ``>`` one or more."""
    pat, sub = pattern.split("."), subject.split(".")
    for i, token in enumerate(pat):
        if token == ">":
            return len(sub) > i
        if i >= len(sub) or (token != "*" and token != sub[i]):
            return False
    return len(pat) == len(sub)


@pytest.mark.parametrize(
    ("name", "token"),
    [
        ("tiny", "tiny"),
        ("org/Model-1.5B", "org_Model-1_5B"),
        ("a b*c>d.e", "a_b_c_d_e"),
        ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama_Llama-3_1-8B-Instruct"),
        ("Qwen_2", "Qwen_2"),
        ("modèle", "mod_le"),
    ],
)
def test_model_token(name: str, token: str) -> None:
    assert model_token(name) == token


def test_model_token_rejects_empty() -> None:
    with pytest.raises(ValueError):
        model_token("")


@pytest.mark.parametrize(
    ("subject", "expected"),
    [
        (S.req_worker("org/M", "w1"), "fleet.req.org_M.w.w1"),
        (S.req_pool("org/M", "decode"), "fleet.req.org_M.pool.decode"),
        (S.submit("org/M"), "fleet.submit.org_M"),
        (S.submit_all(), "fleet.submit.*"),
        (S.requests_all(), "fleet.req.>"),
        (S.tok("r-1"), "fleet.tok.r-1"),
        (S.tok_all(), "fleet.tok.>"),
        (S.cancel("r-1"), "fleet.cancel.r-1"),
        (S.cancel_all(), "fleet.cancel.*"),
        (S.kv("m", "w1"), "fleet.kv.m.w1"),
        (S.kv_all(), "fleet.kv.>"),
        (S.metrics("m", "agg", "w1"), "fleet.metrics.m.agg.w1"),
        (S.metrics_all(), "fleet.metrics.>"),
        (S.obs("m"), "fleet.obs.m"),
        (S.obs_all(), "fleet.obs.*"),
        (S.held("org/M-1.5", "frontend-a.1"), "fleet.held.org_M-1_5.frontend-a_1"),
        (S.held_model("m"), "fleet.held.m.*"),
        (S.held_all(), "fleet.held.*.*"),
        (S.scale("m", "decode"), "fleet.scale.m.decode"),
        (S.scale_status("m", "decode"), "fleet.scale.status.m.decode"),
        (S.scale_all(), "fleet.scale.>"),
        (S.ctl("w1", "health"), "fleet.ctl.w1.health"),
        (S.ctl_worker("w1"), "fleet.ctl.w1.*"),
        (S.dlq("indexer"), "fleet.dlq.indexer"),
        (S.dlq_all(), "fleet.dlq.>"),
    ],
)
def test_subject_layout(subject: str, expected: str) -> None:
    assert subject == expected


def test_default_prefix() -> None:
    assert Subjects().prefix == DEFAULT_PREFIX == "fleet"


def test_custom_prefix_names_streams_and_buckets() -> None:
    s = Subjects("team-a")
    assert s.tok("r1") == "team-a.tok.r1"
    assert s.stream_name("REQUESTS") == "TEAM_A_REQUESTS"
    assert s.bucket_name("workers") == "team_a_workers"


@pytest.mark.parametrize("bad", ["", "a.b", "a b", "*", ">", "a*", "a>b", "w\t1", "wörker", "a/b"])
def test_unsafe_tokens_are_rejected(bad: str) -> None:
    for build in (
        lambda: S.req_worker("m", bad),
        lambda: S.req_pool("m", bad),
        lambda: S.tok(bad),
        lambda: S.cancel(bad),
        lambda: S.kv("m", bad),
        lambda: S.metrics("m", bad, "w"),
        lambda: S.metrics("m", "agg", bad),
        lambda: S.scale("m", bad),
        lambda: S.ctl(bad, "health"),
        lambda: S.ctl("w", bad),
        lambda: S.dlq(bad),
        lambda: Subjects(bad),
    ):
        with pytest.raises(ValueError, match="subject-safe"):
            build()


def test_unsafe_model_names_are_mapped_not_rejected() -> None:
    assert S.submit("a.b>c") == "fleet.submit.a_b_c"


@pytest.mark.parametrize("prefix", ["fleet", "t0a1b2c3d", "team-a"])
@pytest.mark.parametrize(
    ("build", "stream"),
    [
        (lambda s: s.req_worker("org/M", "w1"), "REQUESTS"),
        (lambda s: s.req_pool("org/M", "prefill"), "REQUESTS"),
        (lambda s: s.submit("org/M"), "REQUESTS"),
        (lambda s: s.tok("r1"), "TOKENS"),
        (lambda s: s.kv("org/M", "w1"), "KV"),
        (lambda s: s.metrics("org/M", "agg", "w1"), "METRICS"),
        (lambda s: s.obs("org/M"), "METRICS"),
        (lambda s: s.scale("org/M", "decode"), "SCALING"),
        (lambda s: s.scale_status("org/M", "decode"), "SCALING"),
        (lambda s: s.dlq("router"), "DLQ"),
        (lambda s: s.cancel("r1"), None),
        (lambda s: s.ctl("w1", "health"), None),
    ],
)
def test_each_subject_is_captured_by_exactly_its_stream(prefix, build, stream) -> None:
    s = Subjects(prefix)
    subject = build(s)
    capturing = [
        spec.name
        for spec in fleet_topology(s).streams
        if any(_matches(p, subject) for p in spec.subjects)
    ]
    assert capturing == ([s.stream_name(stream)] if stream else [])


def test_consumer_filters_fall_inside_the_requests_stream() -> None:
    requests = fleet_topology(S).by_name[S.stream_name("REQUESTS")]
    for spec in (pool_consumer(S, "org/M", "decode"), router_consumer(S)):
        sample = spec.filter_subject.replace("*", "x")
        assert any(_matches(p, sample) for p in requests.subjects)
    assert pool_consumer(S, "org/M", "decode").durable == "pool_org_M_decode"


def test_two_prefixes_share_no_stream_subject() -> None:
    a, b = fleet_topology(Subjects("a")), fleet_topology(Subjects("b"))
    for sa in a.streams:
        for sb in b.streams:
            assert sa.name != sb.name
            for p in sa.subjects:
                assert not any(
                    _matches(q, p.replace(">", "x").replace("*", "x")) for q in sb.subjects
                )
