"""The mocker's disaggregation in its pure core, as scripted loops: a decode-side sequence waits
for its remote KV (fair-shared link, only missing blocks under destination_missing), then decodes;
a prefill-side sequence holds its blocks until released."""

from __future__ import annotations

from dataclasses import replace

import pytest

from schemas.kv_events import BlockStored
from tests.unit.mocker_utils import Run, add_and_run, make_request, make_scheduler, record_step
from workers.engines.mocker.scheduler import Scheduler

BLOCK_BYTES = 1_000_000  # 1 MB a block
BANDWIDTH = 1.0  # GB/s: 1 MB takes 1 ms


def scheduler(**overrides: object) -> Scheduler:
    base: dict[str, object] = {
        "kv_block_bytes": BLOCK_BYTES,
        "kv_transfer_bandwidth": BANDWIDTH,
        "num_gpu_blocks": 64,
    }
    return make_scheduler(**(base | overrides))


def remote(rid: str, prompt_len: int, max_tokens: int = 3, start: int = 1000):
    """A decode request: the prompt (``prompt_len`` tokens, KV remote) + the prefill's token."""
    tokens = (*range(start, start + prompt_len), 7)
    return replace(make_request(rid, tokens, max_tokens=max_tokens), remote_prompt=prompt_len)


def test_a_remote_prompt_is_transferred_not_computed_then_decoded() -> None:
    sched = scheduler()
    sched.add_request(remote("d", 10))  # 3 blocks of 4 tokens to move: 3 ms
    run = Run()
    first = record_step(sched, run)
    assert first.outputs == [] and first.num_prefill_tokens == 0
    assert first.simulated_ms == pytest.approx(3.0)
    assert first.transfers_done == (("d", pytest.approx(3.0)),)
    stored = [e for e in run.events if isinstance(e, BlockStored)]
    assert sum(len(e.block_hashes) for e in stored) == 2  # the full blocks, committed on landing
    while sched.has_work:
        record_step(sched, run)
    assert run.finish["d"] == "length" and len(run.tokens["d"]) == 3
    # only the prefill's token is computed here (1), never the prompt
    assert max(s.num_prefill_tokens for s in run.steps) <= 1
    assert sched.stats().kv_usage == 0.0


def test_transfers_into_one_worker_share_its_link_fairly() -> None:
    sched = scheduler()
    sched.add_request(remote("a", 8, start=1000))  # 2 blocks
    sched.add_request(remote("b", 8, start=2000))  # 2 blocks
    first = sched.step()
    # 4 MB at 1 GB/s: both land together after 4 ms (each got half the link)
    assert first.simulated_ms == pytest.approx(4.0)
    assert dict(first.transfers_done) == {"a": pytest.approx(4.0), "b": pytest.approx(4.0)}
    alone = scheduler()
    alone.add_request(remote("a", 8, start=1000))
    assert alone.step().simulated_ms == pytest.approx(2.0)


def test_a_short_transfer_lands_first_and_the_long_one_gets_the_whole_link() -> None:
    sched = scheduler()
    sched.add_request(remote("short", 4, start=1000))  # 1 block
    sched.add_request(remote("long", 16, start=2000))  # 4 blocks
    done: dict[str, float] = {}
    while len(done) < 2:
        done.update(sched.step().transfers_done)
    # shared until the short one lands (2 ms, 1 MB each), then 3 MB alone: 5 ms
    assert done == {"short": pytest.approx(2.0), "long": pytest.approx(5.0)}


@pytest.mark.parametrize(("mode", "ms"), [("destination_missing", 1.0), ("full_prompt", 3.0)])
def test_blocks_already_here_move_only_in_full_prompt_mode(mode: str, ms: float) -> None:
    sched = scheduler(kv_transfer_mode=mode)
    add_and_run(sched, make_request("warm", tuple(range(1000, 1008)), max_tokens=1))
    sched.add_request(remote("d", 10))  # 3 blocks, the first 2 cached here
    first = sched.step()
    assert first.transfers_done == (("d", pytest.approx(ms)),)


def test_compute_and_transfers_overlap() -> None:
    sched = scheduler(kv_transfer_bandwidth=0.1)  # 1 MB takes 10 ms
    sched.add_request(make_request("local", 3, max_tokens=50))
    sched.step()  # its prefill
    sched.add_request(remote("d", 4, start=3000))  # 1 block: 10 ms of link
    elapsed, landed = 0.0, None
    while landed is None:
        step = sched.step()
        elapsed += step.simulated_ms
        assert [o.request_id for o in step.outputs] == ["local"]  # decoding meanwhile
        landed = dict(step.transfers_done).get("d")
    assert landed == pytest.approx(10.0)  # it landed during a decode step of "local"
    assert elapsed >= 10.0


def test_a_prefill_for_a_remote_decode_holds_its_blocks_until_released() -> None:
    sched = scheduler()
    req = replace(make_request("p", 10, max_tokens=1), hold=True)
    run = add_and_run(sched, req)
    assert run.finish["p"] == "length" and not sched.has_work
    stats = sched.stats()
    assert stats.num_held_blocks == 3 and stats.kv_usage > 0
    assert not sched.reset_prefix_cache()  # held blocks are in use
    assert sched.release_held("p") and not sched.release_held("p")
    assert sched.stats().num_held_blocks == 0 and sched.stats().kv_usage == 0.0
    add_and_run(sched, replace(req, request_id="q"))
    assert sched.abort("q")  # aborting a held request frees it too
    assert sched.stats().kv_usage == 0.0


def test_a_transfer_that_cannot_get_blocks_waits() -> None:
    sched = scheduler(num_gpu_blocks=4)
    sched.add_request(remote("a", 12, max_tokens=1, start=1000))  # 4 blocks: all of them
    sched.add_request(remote("b", 4, max_tokens=1, start=2000))
    first = sched.step()
    assert [r for r, _ in first.transfers_done] == ["a"]
    run = Run()
    while sched.has_work:
        record_step(sched, run)
    assert run.finish == {"a": "length", "b": "length"}


def test_the_last_prompt_token_after_a_transfer_costs_a_decode_step_not_a_prefill() -> None:
    sched = scheduler()
    sched.add_request(remote("d", 8))
    sched.step()  # the transfer
    after = sched.step()  # the last prompt token, and the first sampled token
    assert after.num_prefill_tokens == 0 and after.num_decode_seqs == 1
    assert [o.request_id for o in after.outputs] == ["d"]
    assert after.simulated_ms < 16.5  # no prefill term (16.5 ms at least) in the step
