"""The mocker's host-memory KV tier, as scripted loops over the pure core: evicted GPU blocks are
copied to the host tier (LRU), a prompt whose prefix is there loads it back at the modelled PCIe
cost instead of recomputing it, and every change is announced as an event of its tier."""

from __future__ import annotations

import random

import pytest

from schemas.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvCacheEvent
from tests.unit.mocker_utils import BLOCK_SIZE, add_and_run, make_request, make_scheduler, prompt
from workers.engines.mocker.block_pool import BlockPool
from workers.engines.mocker.scheduler import Scheduler
from workers.engines.mocker.timing import decode_ms, prefill_ms

BS = BLOCK_SIZE


def tiers(events: list[KvCacheEvent]) -> dict[str, set[int]]:
    """Each tier's blocks as a reader applying the events in order sees them; a stored block
    whose parent the reader does not hold in some tier would make it heal: fail instead."""
    held: dict[str, set[int]] = {"GPU": set(), "CPU": set()}
    for ev in events:
        if isinstance(ev, BlockStored):
            parent = ev.parent_block_hash
            assert parent is None or any(parent in s for s in held.values()), ev
            held[ev.medium].update(ev.block_hashes)
        elif isinstance(ev, BlockRemoved):
            held[ev.medium].difference_update(ev.block_hashes)
        elif isinstance(ev, AllBlocksCleared):
            for medium, s in held.items():
                if ev.medium in (None, medium):
                    s.clear()
    return held


def pool_tiers(sched: Scheduler) -> dict[str, set[int]]:
    pool: BlockPool = sched.pool
    return {"GPU": set(pool._cached), "CPU": set(pool._host)}


def test_evicted_blocks_go_to_the_host_tier_and_come_back_at_pcie_cost() -> None:
    # 8 GPU blocks: A (4 blocks + 1 for its tokens) is evicted by B and C
    sched = make_scheduler(num_gpu_blocks=8, num_cpu_blocks=16, kv_block_bytes=1_000_000)
    a = prompt(4 * BS + 1, start=100)
    run = add_and_run(sched, make_request("a", a, max_tokens=1))
    run = add_and_run(
        sched,
        make_request("b", prompt(5 * BS, start=200), max_tokens=1),
        make_request("c", prompt(5 * BS, start=300), max_tokens=1),
    )
    copied = [e for e in run.events if isinstance(e, BlockStored) and e.medium == "CPU"]
    assert copied, run.events
    gpu_removed = [e for e in run.events if isinstance(e, BlockRemoved) and e.medium == "GPU"]
    first_copy = run.events.index(copied[0])
    assert gpu_removed and run.events.index(gpu_removed[0]) > first_copy  # copies go first
    host_before = sched.pool.num_host_cached
    assert host_before >= 4

    sched.add_request(make_request("a2", a, max_tokens=1))
    loading = sched.step()  # admitted: its 4 blocks come back over 25 GB/s, 1 MB each
    assert loading.simulated_ms == pytest.approx(4 * 0.04) and not loading.outputs
    assert sched.stats().active_prefill_tokens == 1  # the loaded blocks are not prefill
    again = add_and_run(sched)
    assert again.cached["a2"] == 4 * BS  # every full block of the prompt, none recomputed
    assert sched.stats().host_cached_tokens_total == 4 * BS
    (step,) = again.steps  # then only the last token is computed
    usage = 5 / 8  # the 4 loaded blocks and the one of the last token, of 8
    assert step.simulated_ms == pytest.approx(prefill_ms(1) + decode_ms(usage))
    # loaded blocks are cached on the GPU again (announced), the host copies stay
    assert any(
        isinstance(e, BlockStored) and e.medium == "GPU" for e in sched.take_events() + again.events
    )
    assert sched.pool.num_host_cached >= host_before


def test_without_a_host_tier_the_prompt_is_recomputed() -> None:
    sched = make_scheduler(num_gpu_blocks=8)
    a = prompt(4 * BS + 1, start=100)
    add_and_run(sched, make_request("a", a, max_tokens=1))
    run = add_and_run(
        sched,
        make_request("b", prompt(5 * BS, start=200), max_tokens=1),
        make_request("c", prompt(5 * BS, start=300), max_tokens=1),
    )
    assert not any(getattr(e, "medium", "GPU") == "CPU" for e in run.events)
    again = add_and_run(sched, make_request("a2", a, max_tokens=1))
    assert again.cached["a2"] == 0
    assert sched.stats().host_cached_tokens_total == 0


def test_the_host_tier_drops_its_least_recently_used_block_when_full() -> None:
    sched = make_scheduler(num_gpu_blocks=6, num_cpu_blocks=3)
    events: list[KvCacheEvent] = []
    for i in range(6):
        req = make_request(f"r{i}", prompt(4 * BS + 1, start=100 * (i + 1)), 1)
        events += add_and_run(sched, req).events
    assert sched.pool.num_host_cached == 3
    assert any(isinstance(e, BlockRemoved) and e.medium == "CPU" for e in events)
    assert tiers(events) == pool_tiers(sched)


def test_events_describe_both_tiers_exactly_under_a_random_workload() -> None:
    """Shared prefixes, evictions, load-backs, preemptions: a reader of the events holds the
    pool's tiers block for block, and never meets a block whose parent it does not know."""
    rng = random.Random(7)
    sched = make_scheduler(num_gpu_blocks=24, num_cpu_blocks=20, max_num_seqs=4)
    heads = [prompt(rng.randint(2, 6) * BS, start=1000 * (k + 1)) for k in range(6)]
    events: list[KvCacheEvent] = []
    for i in range(120):
        tail = tuple(rng.randint(1, 250) for _ in range(rng.randint(1, 2 * BS)))
        sched.add_request(make_request(f"q{i}", rng.choice(heads) + tail, rng.randint(1, 6)))
        if i % 3 == 2:
            events += add_and_run(sched).events
    events += add_and_run(sched).events
    assert sched.stats().host_cached_tokens_total > 0  # the host tier served some prompts
    assert tiers(events) == pool_tiers(sched)
    # a reader that lost track rebuilds the same state from the snapshot
    assert tiers(sched.snapshot_events()) == {
        # the snapshot leaves out blocks no prefix can reach (their parent is in no tier)
        t: {h for h in s if reachable(sched, h)}
        for t, s in pool_tiers(sched).items()
    }


def reachable(sched: Scheduler, h: int) -> bool:
    pool = sched.pool
    meta = {**pool._host, **pool._meta}
    while True:
        if h not in meta:
            return False
        parent = meta[h][0]
        if parent is None:
            return True
        h = parent


def test_a_reset_clears_both_tiers() -> None:
    sched = make_scheduler(num_gpu_blocks=6, num_cpu_blocks=8)
    for i in range(4):
        add_and_run(sched, make_request(f"r{i}", prompt(4 * BS + 1, start=100 * (i + 1)), 1))
    assert sched.pool.num_host_cached
    assert sched.reset_prefix_cache()
    assert sched.pool.num_host_cached == 0
    assert sched.take_events()[-1] == AllBlocksCleared()


def test_a_block_whose_parent_is_in_no_tier_is_not_copied() -> None:
    pool = BlockPool(2, BS, num_cpu_blocks=1)
    a, b = pool.allocate(2) or []
    pool.commit([a, b], [11, 12], tuple(range(2 * BS)), None)
    pool.free([a])  # the parent is freed (and evicted) first
    pool.free([b])
    pool.allocate(1)  # evicts A: copied
    pool.allocate(1)  # evicts B: the full tier drops A, so B's parent is in no tier
    events = pool.take_events()
    assert tiers(events) == {"GPU": set(), "CPU": set()}
    assert pool.num_host_cached == 0


def test_a_load_runs_beside_the_batch_and_shares_its_link() -> None:
    """Two prompts loading at once share the host-to-GPU link (each at half speed) while a
    decoding sequence keeps its steps: nothing waits on a load but its own sequence."""
    sched = make_scheduler(
        num_gpu_blocks=32, num_cpu_blocks=32, kv_block_bytes=100_000_000, max_num_batched_tokens=64
    )
    heads = [prompt(4 * BS + 1, start=100 * (k + 1)) for k in range(2)]
    for k, head in enumerate(heads):
        add_and_run(sched, make_request(f"h{k}", head, max_tokens=1))
    for k in range(6):  # push both heads out of the GPU
        add_and_run(sched, make_request(f"f{k}", prompt(5 * BS, start=1000 * (k + 1)), 1))
    assert sched.pool.match_host(sched_hashes(heads[0])) == 4
    sched.add_request(make_request("busy", prompt(BS, start=9000), max_tokens=20))
    sched.step()  # its prefill
    for k, head in enumerate(heads):
        sched.add_request(make_request(f"again{k}", head, max_tokens=1))
    step = sched.step()  # both admitted and loading; the decode goes on
    assert [o.request_id for o in step.outputs] == ["busy"]
    loads = [s for s in sched.running if s.load_left > 0]
    assert len(loads) == 2
    # 400 MB each at 25 GB/s shared: half the link each for the decode step
    assert step.simulated_ms < 32  # both still loading (32 ms each at half the link)
    expected_left = 400_000_000 - 25e6 * step.simulated_ms / 2
    assert all(s.load_left == pytest.approx(expected_left) for s in loads)
    run = add_and_run(sched)
    assert run.cached["again0"] == run.cached["again1"] == 4 * BS


def sched_hashes(tokens: tuple[int, ...]) -> list[int]:
    from schemas.hashing import block_hashes

    return block_hashes(tokens, BS)
