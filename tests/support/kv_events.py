"""KV events for tests and benchmarks: single events and batches built one way, and real event
streams from mocker schedulers under shared-prefix load."""

from __future__ import annotations

import random
from collections.abc import Iterable

from schemas.kv_events import BlockStored, KvCacheEvent, KvEventBatch
from workers.engines.mocker.config import MockerConfig
from workers.engines.mocker.scheduler import Scheduler, SeqRequest
from workers.kv_relay import KvRelay


def stored(
    hashes: Iterable[int],
    parent: int | None,
    block_size: int,
    first_token: int = 0,
    lora_name: str | None = None,
) -> BlockStored:
    """A run of stored blocks (``hashes``, chained after ``parent``) whose token ids count up from
    ``first_token``."""
    run = tuple(hashes)
    tokens = tuple(range(first_token, first_token + block_size * len(run)))
    return BlockStored(run, parent, tokens, block_size, lora_name)


def kv_batch(
    worker_id: str, event_id: int, *events: KvCacheEvent, model: str = "m"
) -> KvEventBatch:
    """``events`` as one worker's batch number ``event_id`` (timestamp 0)."""
    return KvEventBatch(worker_id, model, event_id, 0.0, events)


def mocker_event_batches(
    workers: int = 2,
    requests: int = 40,
    num_blocks: int = 64,
    block_size: int = 4,
    prefixes: int = 4,
    prefix_tokens: int = 32,
    model: str = "m",
    seed: int = 0,
) -> list[KvEventBatch]:
    """Drive one mocker scheduler per worker with shared-prefix requests; return every batch of
    KV events they queued (stores, evictions), through each worker's relay as a worker publishes
    them, in publish order, numbered per worker."""
    rng = random.Random(seed)
    cfg = MockerConfig(
        num_gpu_blocks=num_blocks, block_size=block_size, max_num_seqs=4, max_num_batched_tokens=64
    )
    scheds = [Scheduler(cfg) for _ in range(workers)]
    relays = [KvRelay(True, cfg.kv_branch_blocks) for _ in range(workers)]
    heads = [[rng.randrange(1000) for _ in range(prefix_tokens)] for _ in range(prefixes)]
    event_ids = [0] * workers
    out: list[KvEventBatch] = []
    for i in range(requests):
        w = rng.randrange(workers)
        prompt = (*rng.choice(heads), *(rng.randrange(1000) for _ in range(rng.randint(1, 20))))
        scheds[w].add_request(SeqRequest(f"r{i}", prompt, rng.randint(1, 8), seed=i))
        for _ in range(rng.randint(1, 6)):
            for k, s in enumerate(scheds):
                s.step()
                events = relays[k].relay(s.take_events())
                if events:
                    event_ids[k] += 1
                    out.append(kv_batch(f"w{k}", event_ids[k], *events, model=model))
    return out
