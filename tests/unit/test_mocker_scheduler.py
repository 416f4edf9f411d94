"""The mocker's continuous-batching scheduler as a scripted loop: add requests, step, assert.

Small pools (block size 4) make prefix hits, chunked prefill, budgets, preemption and eviction
visible in a few steps. Output tokens are a pure function of (seed, position), so a request's
tokens are known up front (``expected_tokens``) whatever happened to it on the way.
"""

from __future__ import annotations

import random

import pytest

from schemas.hashing import block_hashes, hash_seed
from schemas.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from tests.unit.mocker_utils import (
    BLOCK_SIZE,
    Run,
    add_and_run,
    expected_tokens,
    make_request,
    make_scheduler,
    prompt,
    record_step,
    run_until_idle,
)
from workers.engines.mocker.scheduler import SeqRequest, default_token_source


def test_single_request_lifecycle() -> None:
    sched = make_scheduler()
    req = make_request("a", 10, max_tokens=3)
    sched.add_request(req)
    assert sched.has_work and sched.stats().active_prefill_tokens == 10
    first = sched.step()
    assert first.num_prefill_tokens == 10 and first.num_decode_seqs == 0
    [out] = first.outputs
    assert (out.request_id, out.num_prompt_tokens, out.num_output_tokens) == ("a", 10, 1)
    assert not out.finished and out.finish_reason is None
    run = run_until_idle(sched)
    assert [o.finish_reason for o in run.steps[-1].outputs] == ["length"]
    assert [t for o in [out] for t in o.new_token_ids] + run.tokens["a"] == expected_tokens(req)
    stats = sched.stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_usage) == (0, 0, 0.0)
    assert stats.prompt_tokens_total == 10 and not sched.has_work


def test_default_token_source_is_ascii_letters_and_pure() -> None:
    tokens = [default_token_source(7, i) for i in range(200)]
    assert all(97 <= t <= 122 for t in tokens) and len(set(tokens)) > 10
    assert tokens == [default_token_source(7, i) for i in range(200)]
    assert tokens != [default_token_source(8, i) for i in range(200)]


@pytest.mark.parametrize(
    ("prompt_len", "cached"),
    [(3, 0), (4, 0), (10, 8), (12, 8), (13, 12)],  # a fully cached prompt recomputes its last block
)
def test_second_identical_prompt_hits_the_prefix_cache(prompt_len: int, cached: int) -> None:
    sched = make_scheduler()
    tokens = prompt(prompt_len)
    run = add_and_run(sched, make_request("a", tokens))
    assert run.cached["a"] == 0
    sched.add_request(make_request("b", tokens))
    first = sched.step()
    assert first.num_prefill_tokens == prompt_len - cached
    assert first.outputs[0].num_cached_tokens == cached
    assert sched.stats().cached_tokens_total == cached


def test_shared_prefix_hits_only_the_common_full_blocks() -> None:
    sched = make_scheduler()
    add_and_run(sched, make_request("a", (*prompt(9), 1, 2, 3)))
    sched.add_request(make_request("b", (*prompt(9), 7, 7, 7)))
    assert sched.step().outputs[0].num_cached_tokens == 8


def test_chunked_prefill_splits_a_long_prompt() -> None:
    sched = make_scheduler(max_num_batched_tokens=16)
    req = make_request("a", 40, max_tokens=2)
    sched.add_request(req)
    steps = [sched.step() for _ in range(4)]
    assert [s.num_prefill_tokens for s in steps] == [16, 16, 8, 0]
    assert [len(s.outputs) for s in steps] == [0, 0, 1, 1]
    assert sched.stats().active_prefill_tokens == 0 and steps[-1].outputs[0].finished


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room() -> None:
    sched = make_scheduler(max_num_batched_tokens=16, enable_chunked_prefill=False)
    sched.add_request(make_request("a", prompt(10, 0), max_tokens=3))
    sched.add_request(make_request("b", prompt(10, 500), max_tokens=3))
    first = sched.step()
    assert [o.request_id for o in first.outputs] == ["a"]
    second = sched.step()  # a decodes (1 token), b's whole prompt fits now
    assert second.num_prefill_tokens == 10 and second.num_decode_seqs == 1


@pytest.mark.parametrize("chunked", [True, False])
def test_a_request_that_can_never_run_is_rejected(chunked: bool) -> None:
    sched = make_scheduler(
        num_gpu_blocks=4, max_num_batched_tokens=8, enable_chunked_prefill=chunked
    )
    sched.add_request(make_request("big", 16 if chunked else 9, max_tokens=2))
    [out] = sched.step().outputs
    assert (out.finished, out.finish_reason, out.new_token_ids) == (True, "error", ())
    assert not sched.has_work


@pytest.mark.parametrize("budget", [8, 16, 33, 64])
def test_token_budget_is_respected(budget: int) -> None:
    sched = make_scheduler(num_gpu_blocks=256, max_num_batched_tokens=budget)
    reqs = [make_request(f"r{i}", prompt(5 + 7 * i, 100 * i), max_tokens=5) for i in range(6)]
    run = add_and_run(sched, *reqs)
    assert all(s.num_prefill_tokens + s.num_decode_seqs <= budget for s in run.steps)
    assert run.tokens == {r.request_id: expected_tokens(r) for r in reqs}


@pytest.mark.parametrize("max_seqs", [1, 3])
def test_max_num_seqs_is_respected(max_seqs: int) -> None:
    sched = make_scheduler(max_num_seqs=max_seqs)
    reqs = [make_request(f"r{i}", prompt(6, 100 * i)) for i in range(5)]
    for r in reqs:
        sched.add_request(r)
    run = Run()
    while sched.has_work:
        record_step(sched, run)
        assert sched.stats().num_running <= max_seqs
    assert run.tokens == {r.request_id: expected_tokens(r) for r in reqs}


def test_preemption_recomputes_and_yields_the_same_tokens() -> None:
    # 8 blocks = 32 tokens; each request grows to 8 + 11 tokens (5 blocks): both cannot fit.
    sched = make_scheduler(num_gpu_blocks=8, max_num_seqs=2)
    old, new = make_request("old", prompt(8, 0), 12), make_request("new", prompt(8, 500), 12)
    later = make_request("later", prompt(4, 900), 2)
    sched.add_request(old)
    sched.add_request(new)
    run = Run()
    while not any(s.preempted for s in run.steps):
        record_step(sched, run)
        if len(run.steps) == 1:
            sched.add_request(later)  # no free slot: waits, and the preempted one goes first
    assert run.steps[-1].preempted == ("new",)  # the most recently admitted goes
    assert [s.request_id for s in sched.waiting][:2] == ["new", "later"]
    run_until_idle(sched, run=run)
    assert sched.stats().num_preempted_total >= 1
    assert run.tokens == {r.request_id: expected_tokens(r) for r in (old, new, later)}
    assert set(run.finish.values()) == {"length"}
    assert sched.pool.num_used == 0


def test_preempted_full_blocks_stay_cached_for_the_recompute() -> None:
    sched = make_scheduler(num_gpu_blocks=8)
    run = add_and_run(
        sched, make_request("old", prompt(8, 0), 12), make_request("new", prompt(8, 500), 12)
    )
    assert any(s.preempted for s in run.steps)
    assert run.cached["new"] == 0  # reported at first admission only
    recompute = [s for s in run.steps if s.num_prefill_tokens and s is not run.steps[0]]
    assert recompute and all(s.num_prefill_tokens < 8 + 12 for s in recompute)


@pytest.mark.parametrize("when", ["waiting", "running"])
def test_abort_frees_blocks(when: str) -> None:
    sched = make_scheduler(max_num_seqs=1)
    sched.add_request(make_request("a", 10, max_tokens=50))
    sched.add_request(make_request("b", 10, max_tokens=50))
    sched.step()
    target = "b" if when == "waiting" else "a"
    assert sched.abort(target) is True
    assert sched.abort(target) is False and sched.abort("nope") is False
    if when == "running":
        assert sched.pool.num_used == 0
        assert sched.stats().num_waiting == 1
    run = run_until_idle(sched)
    assert set(run.tokens) == {"b" if when == "running" else "a"}
    assert sched.pool.num_used == 0


def test_block_stored_events_match_the_fleet_hashing() -> None:
    sched = make_scheduler()
    req = make_request("a", 10, max_tokens=7)
    sched.add_request(req)
    sched.step()  # computes the 10 prompt tokens: blocks 0 and 1 are full
    h = block_hashes(req.prompt_token_ids, BLOCK_SIZE)
    assert sched.take_events() == [
        BlockStored(tuple(h), None, req.prompt_token_ids[:8], BLOCK_SIZE)
    ]
    run = run_until_idle(sched)  # 10 + 6 computed tokens: blocks 2 and 3 fill with outputs
    full = (*req.prompt_token_ids, *expected_tokens(req))
    all_h = block_hashes(full, BLOCK_SIZE)
    stored = [e for e in run.events if isinstance(e, BlockStored)]
    assert [e.block_hashes for e in stored] == [(all_h[2],), (all_h[3],)]
    assert [e.parent_block_hash for e in stored] == [all_h[1], all_h[2]]
    assert [e.token_ids for e in stored] == [full[8:12], full[12:16]]


def test_lora_seeds_the_block_hashes_and_isolates_the_cache() -> None:
    sched = make_scheduler()
    tokens = prompt(8)
    run = add_and_run(sched, make_request("a", tokens, lora_name="x"))
    [first] = [e for e in run.events if isinstance(e, BlockStored)][:1]
    assert first.lora_name == "x"
    assert list(first.block_hashes) == block_hashes(tokens, BLOCK_SIZE, hash_seed("x"))
    sched.add_request(make_request("b", tokens))  # base model: no hit on the adapter's blocks
    assert sched.step().outputs[0].num_cached_tokens == 0


def test_new_work_evicts_cached_blocks_lru_and_reports_it() -> None:
    sched = make_scheduler(num_gpu_blocks=4)
    a = make_request("a", prompt(8, 0), max_tokens=1)
    add_and_run(sched, a)
    h = block_hashes(a.prompt_token_ids, BLOCK_SIZE)
    assert sched.pool.num_cached == 2 and sched.pool.num_used == 0
    sched.take_events()
    run = add_and_run(sched, make_request("b", prompt(13, 500), max_tokens=1))
    assert [e for e in run.events if isinstance(e, BlockRemoved)] == [BlockRemoved((h[1], h[0]))]
    assert sched.pool.match_prefix(h) == []


def test_reset_prefix_cache() -> None:
    sched = make_scheduler()
    tokens = prompt(12)
    sched.add_request(make_request("a", tokens, max_tokens=3))
    sched.step()
    assert sched.reset_prefix_cache() is False  # blocks in use
    run_until_idle(sched)
    sched.take_events()
    assert sched.reset_prefix_cache() is True
    assert sched.take_events() == [AllBlocksCleared()]
    sched.add_request(make_request("b", tokens))
    assert sched.step().outputs[0].num_cached_tokens == 0


def test_stats_during_a_run() -> None:
    sched = make_scheduler(max_num_seqs=1, max_num_batched_tokens=8)
    sched.add_request(make_request("a", 12))
    sched.add_request(make_request("b", 5))
    assert sched.stats().active_prefill_tokens == 17
    sched.step()  # a's first chunk of 8
    st = sched.stats()
    assert (st.num_running, st.num_waiting, st.active_prefill_tokens) == (1, 1, 4 + 5)
    assert st.active_decode_blocks == 2 and st.kv_usage == 2 / 64 and st.num_free_blocks == 62


def random_workload(seed: int) -> list[tuple[int, SeqRequest]]:
    rng = random.Random(seed)
    heads = [prompt(rng.randint(4, 20), 1000 * k) for k in range(3)]
    return [
        (
            rng.randint(0, 3),
            make_request(
                f"r{i}", (*rng.choice(heads), *prompt(rng.randint(1, 9), 50)), rng.randint(1, 12)
            ),
        )
        for i in range(30)
    ]


def drive(seed: int) -> Run:
    sched = make_scheduler(num_gpu_blocks=24, max_num_seqs=4, max_num_batched_tokens=24)
    run = Run()
    for gap, req in random_workload(seed):
        sched.add_request(req)
        for _ in range(gap):
            record_step(sched, run)
    return run_until_idle(sched, run=run)


def test_deterministic() -> None:
    a, b = drive(3), drive(3)
    assert a.steps == b.steps and a.events == b.events
    assert len(a.tokens) == 30 and set(a.finish.values()) == {"length"}
    assert any(isinstance(e, BlockRemoved) for e in a.events)


def test_a_migrated_request_continues_the_same_stream() -> None:
    """Attempt 2 carries the first k generated tokens in its prompt and starts at position k:
    its output is exactly the rest of an undisturbed run with the same seed."""
    whole = make_request("r", 12, max_tokens=10, seed=7)
    undisturbed = add_and_run(make_scheduler(), whole).tokens["r"]
    k = 4
    moved = SeqRequest("r", whole.prompt_token_ids + tuple(undisturbed[:k]), 10 - k, 7, None, k)
    resumed = add_and_run(make_scheduler(), moved).tokens["r"]
    assert undisturbed[:k] + resumed == undisturbed


# ------------------------------------------------------------- counted exactly (mutation runs)
def test_preemptions_are_counted_one_each() -> None:
    sched = make_scheduler(num_gpu_blocks=8, max_num_seqs=2)
    run = add_and_run(
        sched, make_request("old", prompt(8, 0), 12), make_request("new", prompt(8, 500), 12)
    )
    preempted = sum(len(s.preempted) for s in run.steps)
    assert preempted >= 1 and sched.stats().num_preempted_total == preempted
    assert make_scheduler().stats().num_preempted_total == 0


def test_prompt_and_cached_totals_add_up_over_requests() -> None:
    sched = make_scheduler()
    add_and_run(sched, make_request("a", prompt(10)), make_request("b", prompt(13, 5000)))
    add_and_run(sched, make_request("c", prompt(10)))  # a's two full blocks are cached
    stats = sched.stats()
    assert stats.prompt_tokens_total == 10 + 13 + 10
    assert stats.cached_tokens_total == 8


def test_without_prefix_caching_nothing_is_reused() -> None:
    sched = make_scheduler(enable_prefix_caching=False)
    run = add_and_run(sched, make_request("a", prompt(12)))
    run = add_and_run(sched, make_request("b", prompt(12)))
    assert run.cached == {"b": 0} and sched.stats().cached_tokens_total == 0


def test_a_request_that_just_fits_the_pool_is_not_rejected() -> None:
    # 4 blocks of 4: a 10-token prompt with 7 outputs needs 10 + 7 - 1 = 16 KV tokens
    sched = make_scheduler(num_gpu_blocks=4, max_num_batched_tokens=64)
    run = add_and_run(sched, make_request("fits", prompt(10), max_tokens=7))
    assert run.finish == {"fits": "length"} and len(run.tokens["fits"]) == 7
    run = add_and_run(sched, make_request("over", prompt(10), max_tokens=8))
    assert run.finish["over"] not in ("length", "stop")  # 17 tokens: 5 blocks, never


def test_without_chunking_a_prompt_of_exactly_the_budget_runs() -> None:
    sched = make_scheduler(enable_chunked_prefill=False, max_num_batched_tokens=16)
    run = add_and_run(sched, make_request("exact", prompt(16), max_tokens=1))
    assert run.finish == {"exact": "length"}


def test_a_rejected_request_reports_its_prompt_and_nothing_else() -> None:
    from workers.engines.mocker.scheduler import SeqOutput

    sched = make_scheduler(num_gpu_blocks=4)
    sched.add_request(make_request("big", 20, max_tokens=2))
    sched.add_request(make_request("ok", 4, max_tokens=1))
    assert sched.stats().num_waiting == 2  # the rejected one waits for its error output too
    outputs = sched.step().outputs
    assert outputs[0] == SeqOutput("big", (), True, "error", 20, 0, 0)
    assert not sched.abort("big")  # finished: nothing left to abort
    run_until_idle(sched)
    assert sched.stats().num_waiting == 0


def test_aborting_a_rejected_request_before_its_step_leaves_no_output() -> None:
    sched = make_scheduler(num_gpu_blocks=4)
    sched.add_request(make_request("big", 20, max_tokens=2))
    assert sched.abort("big") and not sched.has_work
    assert sched.step().outputs == []


def test_a_prefill_chunk_does_not_hold_back_the_decodes_of_its_step() -> None:
    sched = make_scheduler(max_num_batched_tokens=8)
    sched.add_request(make_request("dec", 4, max_tokens=6))
    sched.step()  # dec prefilled, first token out
    sched.add_request(make_request("long", prompt(30, 7000), max_tokens=1))
    step = sched.step()
    by_id = {o.request_id: o for o in step.outputs}
    assert len(by_id["dec"].new_token_ids) == 1  # decoded in the step that chunked "long"
    assert "long" not in by_id or by_id["long"].new_token_ids == ()
    assert step.num_prefill_tokens == 7 and step.num_decode_seqs == 1


def test_the_token_source_is_pinned() -> None:
    """Workers on different hosts and versions must agree on it: a migrated request resumes on
    another worker at its position and the client sees one stream."""
    assert [default_token_source(7, i) for i in range(8)] == [
        114,
        113,
        110,
        105,
        120,
        102,
        100,
        113,
    ]
    assert [default_token_source(2**63 + 5, i) for i in range(3)] == [113, 98, 122]


def test_add_request_refuses_with_reasons() -> None:
    sched = make_scheduler()
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        sched.add_request(make_request("a", 4, max_tokens=0))
    sched.add_request(make_request("a", 4))
    with pytest.raises(ValueError, match="duplicate request id 'a'"):
        sched.add_request(make_request("a", 4))


def test_the_watermark_is_kept_free_only_while_something_runs() -> None:
    # 8 blocks, watermark 25% = 2 blocks
    sched = make_scheduler(num_gpu_blocks=8, watermark=0.25, max_num_batched_tokens=64)
    sched.add_request(make_request("alone", prompt(32), max_tokens=1))  # all 8 blocks
    first = sched.step()
    assert [o.request_id for o in first.outputs] == ["alone"]  # nothing ran: no watermark
    sched = make_scheduler(num_gpu_blocks=8, watermark=0.25, max_num_batched_tokens=64)
    sched.add_request(make_request("a", prompt(8), max_tokens=8))  # 2 blocks, grows to 4
    sched.step()
    sched.add_request(make_request("b", prompt(16, 3000), max_tokens=1))  # 4 blocks: 8-2-4 < 2
    step = sched.step()
    assert "b" not in {o.request_id for o in step.outputs}
    assert [s.request_id for s in sched.waiting] == ["b"]
    sched.add_request(make_request("c", prompt(7, 6000), max_tokens=1))  # 2 blocks: 8-2-2 >= 2
    assert sched.waiting[0].request_id == "b"


def test_cached_totals_add_every_hit() -> None:
    sched = make_scheduler()
    for rid in ("a", "b", "c"):
        add_and_run(sched, make_request(rid, prompt(10)))  # b and c hit a's two full blocks
    assert sched.stats().cached_tokens_total == 16


def test_two_budget_tokens_decode_two_sequences_in_one_step() -> None:
    sched = make_scheduler(max_num_batched_tokens=2)
    a, b = make_request("a", 2, max_tokens=6), make_request("b", prompt(2, 4000), max_tokens=6)
    sched.add_request(a)
    sched.add_request(b)
    run = run_until_idle(sched)
    assert max(s.num_decode_seqs for s in run.steps) == 2
    assert all(s.num_prefill_tokens + s.num_decode_seqs <= 2 for s in run.steps)
    assert run.tokens == {"a": expected_tokens(a), "b": expected_tokens(b)}


def test_blocks_in_use_follow_the_tokens_exactly() -> None:
    sched = make_scheduler()
    sched.add_request(make_request("a", 4, max_tokens=9))  # 4 prompt tokens: 1 block
    used = []
    while sched.has_work:
        sched.step()
        used.append(sched.stats().num_free_blocks)
    # tokens held after each step: 4 (+0 sampled into KV yet), 5, 6, ... blocks = ceil / 4
    assert used[:6] == [64 - 1, 64 - 2, 64 - 2, 64 - 2, 64 - 2, 64 - 3]
    assert used[-1] == 64


def test_every_preemption_is_counted() -> None:
    sched = make_scheduler(num_gpu_blocks=8, max_num_seqs=3)
    reqs = [make_request(f"r{i}", prompt(8, 1000 * i), 12) for i in range(3)]
    run = add_and_run(sched, *reqs)
    preempted = sum(len(s.preempted) for s in run.steps)
    assert preempted >= 2 and sched.stats().num_preempted_total == preempted
    assert run.tokens == {r.request_id: expected_tokens(r) for r in reqs}
    for s in (s for s in run.steps if s.preempted):  # the others decode on; no prefill now
        served = {o.request_id for o in s.outputs}
        assert served and not served & set(s.preempted)
        assert s.num_prefill_tokens == 0 and s.num_decode_seqs == len(served)


def test_recomputing_a_one_token_prompt_and_its_token_is_a_prefill() -> None:
    sched = make_scheduler(num_gpu_blocks=3)
    y, x = make_request("y", prompt(8), max_tokens=2), make_request("x", prompt(1, 900), 3)
    sched.add_request(y)
    sched.add_request(x)
    run = run_until_idle(sched)
    preempted_at = next(i for i, s in enumerate(run.steps) if s.preempted)
    assert run.steps[preempted_at].preempted == ("x",)  # after its first token: 2 tokens held
    again = next(s for s in run.steps[preempted_at + 1 :] if s.num_prefill_tokens)
    assert (again.num_prefill_tokens, again.num_decode_seqs) == (2, 0)  # both recomputed
    assert run.tokens == {"y": expected_tokens(y), "x": expected_tokens(x)}


def test_a_lower_priority_value_is_admitted_first_and_preempted_last() -> None:
    """As vLLM's priority policy: the waiting queue is ordered by priority (FIFO among equals),
    and room is made by preempting the newest of the lowest priority."""
    from dataclasses import replace

    sched = make_scheduler(max_num_seqs=1)
    batch = [replace(make_request(f"b{i}", prompt(6, 100 * i)), priority=1) for i in range(2)]
    urgent = make_request("urgent", prompt(6, 900))
    for r in (*batch, urgent):
        sched.add_request(r)
    assert [s.request_id for s in sched.waiting] == ["urgent", "b0", "b1"]
    first = sched.step()
    assert [o.request_id for o in first.outputs] == ["urgent"]

    # 8 blocks: two sequences that grow to 5 blocks each cannot both stay; the batch one goes
    # although it was admitted first
    sched = make_scheduler(num_gpu_blocks=8, max_num_seqs=2)
    low = replace(make_request("low", prompt(8, 0), 12), priority=1)
    high = make_request("high", prompt(8, 500), 12)
    sched.add_request(low)
    sched.add_request(high)
    run = Run()
    while not any(s.preempted for s in run.steps):
        record_step(sched, run)
    assert run.steps[-1].preempted == ("low",)
    run_until_idle(sched, run=run)
    assert run.tokens == {r.request_id: expected_tokens(r) for r in (low, high)}
