"""Routing quality in simulated time: the routing_quality workload without processes or clocks.

    python -m tests.bench.routing_sim [--policies kv,round-robin,random] [--seeds 8]
    python -m tests.bench.routing_sim --sweep    # kv weight x overhead x temperature grid
    python -m tests.bench.routing_sim --prefixes 1 --prefix-tokens 0 --unique-tokens 16384 \
        --concurrency 12 --requests 240 --output-tokens 16 --num-gpu-blocks 16384
                                                 # fresh 16k-token prompts (long_prompts' shape)

Each worker is the mocker's own scheduler core (``workers.engines.mocker.scheduler``); its KV
events are relayed as a worker does (``KvRelay``) and applied to the in-memory prefix index at
the end of each step, as the live indexer would a few milliseconds later; ``kv`` routes with
that index's
``route`` (the same cost, pick and reservations as the Lua script, checked by the contract
suite) plus the router's recent-route hints (``RecentRoutes``). Prefill reservations are
released at the first token and the rest at the end, as the frontend does. A closed loop of
``concurrency`` clients sends the next request as soon as one finishes, with ``--latency-ms``
between a client and a worker each way.

What it leaves out: the workers' periodic load reports (reservations only), the frontend's and
the network's jitter, and CPU contention. In exchange a run takes a fraction of a second and is
deterministic, so settings can be compared over many seeds; the live benchmark confirms the
choice (docs/benchmarks.md). Prints JSON: per policy the mean over seeds of each figure.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
import json
import random
import statistics
import sys
from dataclasses import dataclass, field, replace

from router.kv.index import InMemoryPrefixIndex
from router.kv.router import RecentRoutes
from router.kv.routing import RouteCall, WorkerPool
from router.kv.translate import fleet_hashes_for_prompt, ops_of
from schemas.kv_events import KvEventBatch
from tests.bench.loadgen import percentile
from tests.bench.routing_quality import workload
from workers.engines.mocker.config import MockerConfig
from workers.engines.mocker.scheduler import Scheduler, SeqRequest, StepResult
from workers.kv_relay import KvRelay

MODEL = "sim"


@dataclass(frozen=True)
class SimSettings:
    policy: str = "kv"
    prefill_weight: float = 8.0
    prefill_overhead_blocks: int = 4
    temperature: float = 8.0
    hint_ttl_s: float = 5.0
    workers: int = 4
    num_gpu_blocks: int = 192
    block_size: int = 64
    requests: int = 600
    concurrency: int = 16
    prefixes: int = 20
    prefix_tokens: int = 1024
    unique_tokens: int = 128
    output_tokens: int = 32
    latency_ms: float = 1.0


@dataclass
class _Worker:
    wid: str
    sched: Scheduler
    busy: bool = False
    event_id: int = 0


@dataclass(order=True)
class _Event:
    at_ms: float
    order: int
    kind: str = field(compare=False)
    data: object = field(compare=False)


class Simulation:
    def __init__(self, s: SimSettings, seed: int) -> None:
        self.s = s
        self.rng = random.Random(seed)
        prompts = workload(s.requests, s.prefixes, s.prefix_tokens, s.unique_tokens, seed)
        self.tokens = [tuple(p.encode()) for p in prompts]  # jetfleet-tiny: one token per byte
        cfg = MockerConfig(num_gpu_blocks=s.num_gpu_blocks, block_size=s.block_size)
        self.workers = [_Worker(f"w{i}", Scheduler(cfg)) for i in range(s.workers)]
        self.index = InMemoryPrefixIndex()
        self.relays = {w.wid: KvRelay(True, cfg.kv_branch_blocks) for w in self.workers}
        self.pool = WorkerPool(tuple(w.wid for w in self.workers))
        self.hints = RecentRoutes(s.hint_ttl_s)
        self.queue: list[_Event] = []
        self.order = itertools.count()
        self.stream_seq = 0
        self.sent_ms: dict[int, float] = {}
        self.ttft_ms: dict[int, float] = {}
        self.cached: dict[int, int] = {}
        self.rr = itertools.count()

    def _push(self, at_ms: float, kind: str, data: object) -> None:
        heapq.heappush(self.queue, _Event(at_ms, next(self.order), kind, data))

    async def _route(self, i: int, now_ms: float) -> int:
        s = self.s
        if s.policy == "round-robin":
            return next(self.rr) % s.workers
        if s.policy == "random":
            return self.rng.randrange(s.workers)
        toks = self.tokens[i]
        hashes = tuple(fleet_hashes_for_prompt(toks, s.block_size))
        hints = await self.hints.match(MODEL, hashes, now_ms / 1000)
        call = RouteCall(
            MODEL,
            str(i),
            hashes,
            -(-len(toks) // s.block_size),
            self.pool,
            self.pool.workers,
            hints,
            s.prefill_weight,
            s.prefill_overhead_blocks,
            s.temperature,
            self.rng.random(),
            int(now_ms),
            ttl_ms=10**9,
        )
        out = await self.index.route(call)
        await self.hints.record(now_ms / 1000, MODEL, out.winner, hashes)
        return int(out.winner[1:])

    def _step(self, w: int, now_ms: float) -> None:
        worker = self.workers[w]
        result = worker.sched.step()
        worker.busy = True
        self._push(now_ms + result.simulated_ms, "step_end", (w, result))

    async def _step_end(self, w: int, result: StepResult, now_ms: float) -> None:
        worker = self.workers[w]
        worker.busy = False
        events = worker.sched.take_events()
        if events:  # indexed when the step's results exist (the live indexer: a few ms later)
            worker.event_id += 1
            self.stream_seq += 1
            relayed = tuple(self.relays[worker.wid].relay(events))
            batch = KvEventBatch(worker.wid, MODEL, worker.event_id, 0.0, relayed)
            ops = ops_of(batch)
            await self.index.apply(MODEL, worker.wid, worker.event_id, self.stream_seq, ops)
        back = now_ms + self.s.latency_ms
        for out in result.outputs:
            i = int(out.request_id)
            if i not in self.ttft_ms and out.new_token_ids:
                self.ttft_ms[i] = back - self.sent_ms[i]
                self.cached[i] = out.num_cached_tokens
                await self.index.release(out.request_id, prefill_only=True)
            if out.finished:
                await self.index.release(out.request_id)
                self._push(back, "send", None)
        if worker.sched.has_work:
            self._step(w, now_ms)

    async def run(self) -> dict[str, float]:
        todo = iter(range(self.s.requests))
        for c in range(self.s.concurrency):
            self._push(c * 0.5, "send", None)  # the clients' first sends, 0.5 ms apart
        while self.queue:
            ev = heapq.heappop(self.queue)
            if ev.kind == "send":
                i = next(todo, None)
                if i is not None:
                    self.sent_ms[i] = ev.at_ms
                    w = await self._route(i, ev.at_ms)
                    self._push(ev.at_ms + self.s.latency_ms, "arrive", (w, i))
            elif ev.kind == "arrive":
                w, i = ev.data  # type: ignore[misc]
                req = SeqRequest(str(i), self.tokens[i], self.s.output_tokens, i)
                self.workers[w].sched.add_request(req)
                if not self.workers[w].busy:
                    self._step(w, ev.at_ms)
            else:
                w, result = ev.data  # type: ignore[misc]
                await self._step_end(w, result, ev.at_ms)
        return self._summary()

    def _summary(self) -> dict[str, float]:
        ttft = list(self.ttft_ms.values())
        warm = [v for i, v in self.ttft_ms.items() if i >= self.s.concurrency]
        prompt = sum(len(self.tokens[i]) for i in self.ttft_ms)
        return {
            "cached_share": sum(self.cached.values()) / prompt,
            "ttft_ms_p50": percentile(ttft, 50),
            "ttft_ms_p90": percentile(ttft, 90),
            "ttft_ms_p99": percentile(ttft, 99),
            "warm_ttft_ms_p99": percentile(warm, 99),
            "total_s": max(self.sent_ms.values()) / 1000,
        }


def simulate(s: SimSettings, seeds: int) -> dict[str, object]:
    runs = [asyncio.run(Simulation(s, seed).run()) for seed in range(seeds)]
    row: dict[str, object] = {"policy": s.policy}
    if s.policy == "kv":
        row.update(
            prefill_weight=s.prefill_weight,
            prefill_overhead_blocks=s.prefill_overhead_blocks,
            temperature=s.temperature,
        )
    for key in runs[0]:
        row[key] = round(statistics.fmean(r[key] for r in runs), 3 if key == "cached_share" else 1)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--policies", default="kv,round-robin,random")
    ap.add_argument("--seeds", type=int, default=8, help="workload and routing seeds 0..N-1")
    ap.add_argument("--kv-prefill-weight", type=float, default=8.0)
    ap.add_argument("--kv-prefill-overhead", type=int, default=4)
    ap.add_argument("--kv-temperature", type=float, default=8.0)
    ap.add_argument("--sweep", action="store_true", help="kv over a grid of settings")
    shape = SimSettings()
    for name in (
        "workers", "num_gpu_blocks", "block_size", "requests", "concurrency", "prefixes",
        "prefix_tokens", "unique_tokens", "output_tokens",
    ):  # fmt: skip
        flag = "--" + name.replace("_", "-")
        ap.add_argument(flag, type=int, default=getattr(shape, name), help="workload shape")
    ap.add_argument("--latency-ms", type=float, default=shape.latency_ms)
    args = ap.parse_args(argv)
    workload_shape = {
        name: getattr(args, name)
        for name in (
            "workers", "num_gpu_blocks", "block_size", "requests", "concurrency", "prefixes",
            "prefix_tokens", "unique_tokens", "output_tokens", "latency_ms",
        )
    }  # fmt: skip
    base = SimSettings(
        prefill_weight=args.kv_prefill_weight,
        prefill_overhead_blocks=args.kv_prefill_overhead,
        temperature=args.kv_temperature,
        **workload_shape,
    )
    if args.sweep:
        grid = itertools.product((4.0, 8.0, 12.0, 16.0), (0, 4, 8, 17), (0.0, 8.0))
        settings = [
            replace(base, prefill_weight=w, prefill_overhead_blocks=o, temperature=t)
            for w, o, t in grid
        ]
        settings += [replace(base, policy="round-robin")]
    else:
        settings = [replace(base, policy=p) for p in args.policies.split(",")]
    rows = []
    for s in settings:
        row = simulate(s, args.seeds)
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    out = {"benchmark": "routing_sim", "seeds": args.seeds, "shape": workload_shape}
    out["results"] = rows
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
