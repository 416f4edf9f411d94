"""Disaggregated against aggregated serving in simulated time: the ``disagg`` workloads on the
mocker's own scheduler cores, without processes or clocks, so comparisons are deterministic.

    python -m tests.bench.disagg_sim [--workloads long,short] [--seeds 3]

Each worker is a ``Scheduler`` (the mocker's pure core) stepped by an event loop: a step's
outputs exist when its simulated duration has passed. Aggregated requests go to the worker with
the fewest requests; disaggregated ones are placed as ``router/disagg.py`` says (the decode
worker chosen first, least loaded; its cached prefix decides ``isl_or_load``; a prompt short
enough to be prefilled locally anywhere goes to the least loaded worker of both pools): a remote
prefill
runs on the least loaded prefill worker with ``max_tokens=1`` and holds its blocks; the decode
worker pulls the KV over its fair-shared link (the core's transfer model) and generates every
token; the prefill worker frees its blocks when the transfer lands. Closed loop, the same
workloads and worker budget as ``tests/bench/disagg.py``.

Left out: routing and network latency (zero), the frontend, CPU contention, KV-aware routing
(least loaded here). Prints JSON: per workload and fleet the mean over seeds of each figure.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
import statistics
import sys
from dataclasses import dataclass, field

from router.disagg import DisaggConfig, place, routes_over_both_pools, uncached_tokens
from schemas.hashing import block_hashes, hash_seed
from tests.bench.loadgen import percentile
from workers.engines.mocker.config import MockerConfig
from workers.engines.mocker.scheduler import Scheduler, SeqRequest, StepResult

SPLIT = ("prefill", "prefill", "decode", "decode")
FLEETS: dict[str, tuple[tuple[str, ...], DisaggConfig]] = {
    "agg4": (("agg",) * 4, DisaggConfig(policy="never")),
    "1p3d": (("prefill", "decode", "decode", "decode"), DisaggConfig(policy="always")),
    "2p2d": (SPLIT, DisaggConfig(policy="always")),
    "cond2p2d": (SPLIT, DisaggConfig(policy="isl_or_load")),
    "cond2p2d-decode-only": (
        SPLIT,
        DisaggConfig(policy="isl_or_load", local_on_prefill_workers=False),
    ),
}
WORKLOADS = {  # requests, prompt tokens (shared prefix, fresh tail), output tokens, concurrency
    "long": (48, 0, 7936, 256, 8),
    "long50": (96, 0, 7936, 50, 8),  # NVIDIA Dynamo's published shape: ~8k in, 50 out
    "short": (160, 1024, 64, 64, 16),
}
BLOCK_BYTES = 2 << 20  # the shipped card: Llama-3.1-8B's KV geometry, 16-token blocks


@dataclass
class _Worker:
    index: int
    role: str
    sched: Scheduler
    busy: bool = False


@dataclass
class _Req:
    rid: str
    prompt: tuple[int, ...]
    osl: int
    seed: int
    client: int
    arrived: float
    tokens: list[float] = field(default_factory=list)  # time of each generated token
    prefill_worker: int = -1


class Simulation:
    def __init__(self, fleet: str, workload: str, seed: int) -> None:
        roles, disagg = FLEETS[fleet]
        cfg = MockerConfig(kv_block_bytes=BLOCK_BYTES)
        self.workers = [_Worker(i, r, Scheduler(cfg)) for i, r in enumerate(roles)]
        self.disagg = disagg
        self.events: list[tuple[float, int, str, object]] = []
        self.order = itertools.count()
        self.now = 0.0
        self.reqs: dict[str, _Req] = {}
        self.done: list[_Req] = []
        n, prefix, tail, self.osl, self.concurrency = WORKLOADS[workload]
        rng = random.Random(seed)
        heads = [tuple(rng.randrange(1000, 30000) for _ in range(prefix)) for _ in range(8)]
        self.prompts = [
            rng.choice(heads) + tuple(rng.randrange(1000, 30000) for _ in range(tail))
            for _ in range(n)
        ]
        self.next_prompt = 0
        self.placements: list[bool] = []

    # ---- the event loop
    def push(self, at: float, kind: str, payload: object) -> None:
        heapq.heappush(self.events, (at, next(self.order), kind, payload))

    def run(self) -> dict[str, float]:
        for client in range(self.concurrency):
            self.submit(client)
        while self.events:
            self.now, _, kind, payload = heapq.heappop(self.events)
            if kind == "step_end":
                self.step_end(*payload)  # type: ignore[misc]
        return self.figures()

    def kick(self, w: _Worker) -> None:
        if not w.busy and w.sched.has_work:
            result = w.sched.step()
            w.busy = True
            self.push(self.now + result.simulated_ms / 1000, "step_end", (w, result))

    def step_end(self, w: _Worker, result: StepResult) -> None:
        w.busy = False
        for rid, _ms in result.transfers_done:  # the decode side pulled it: free the hold
            prefill = self.workers[self.reqs[rid].prefill_worker]
            prefill.sched.release_held(f"{rid}-prefill")
        for out in result.outputs:
            if out.request_id.endswith("-prefill"):
                if out.finished:
                    self.to_decode(self.reqs[out.request_id.removesuffix("-prefill")], remote=True)
                continue
            req = self.reqs[out.request_id]
            req.tokens.extend([self.now] * len(out.new_token_ids))
            if out.finished:
                self.done.append(req)
                self.submit(req.client)
        self.kick(w)

    # ---- requests
    def least_loaded(self, *roles: str) -> _Worker:
        pool = [w for w in self.workers if w.role in roles]
        return min(
            pool, key=lambda w: (w.sched.stats().num_running + len(w.sched.waiting), w.index)
        )

    def submit(self, client: int) -> None:
        if self.next_prompt >= len(self.prompts):
            return
        i = self.next_prompt
        self.next_prompt += 1
        req = _Req(f"r{i}", self.prompts[i], self.osl, i, client, self.now)
        self.reqs[req.rid] = req
        if all(w.role == "agg" for w in self.workers):
            self.add(self.least_loaded("agg"), req, remote=False)
            return
        if routes_over_both_pools(self.disagg, len(req.prompt)):  # local wherever it lands
            self.placements.append(False)
            self.add(self.least_loaded("decode", "prefill"), req, remote=False)
            return
        decode = self.least_loaded("decode")
        bs = decode.sched.config.block_size
        hashes = block_hashes(list(req.prompt), bs, hash_seed(None))
        cached = len(decode.sched.pool.match_prefix(hashes))
        queued = [
            w.sched.stats().num_running + len(w.sched.waiting)
            for w in self.workers
            if w.role == "prefill"
        ]
        remote = place(self.disagg, uncached_tokens(len(req.prompt), cached, bs), queued).remote
        self.placements.append(remote)
        if not remote:
            self.add(decode, req, remote=False)
            return
        prefill = self.least_loaded("prefill")
        req.prefill_worker = prefill.index
        prefill.sched.add_request(
            SeqRequest(f"{req.rid}-prefill", req.prompt, 1, req.seed, hold=True)
        )
        self.kick(prefill)

    def to_decode(self, req: _Req, remote: bool) -> None:
        self.add(self.least_loaded("decode"), req, remote)

    def add(self, w: _Worker, req: _Req, remote: bool) -> None:
        remote_prompt = len(req.prompt) - 1 if remote else 0
        w.sched.add_request(
            SeqRequest(req.rid, req.prompt, req.osl, req.seed, remote_prompt=remote_prompt)
        )
        self.kick(w)

    # ---- figures
    def figures(self) -> dict[str, float]:
        ttft = [(r.tokens[0] - r.arrived) * 1000 for r in self.done]
        itl = [  # each request's mean gap (as genai-perf and aiperf report ITL)
            (r.tokens[-1] - r.tokens[0]) * 1000 / (len(r.tokens) - 1)
            for r in self.done
            if len(r.tokens) > 1
        ]
        gaps = [
            (b - a) * 1000 for r in self.done for a, b in itertools.pairwise(r.tokens) if b > a
        ] + [0.0 for r in self.done for a, b in itertools.pairwise(r.tokens) if b <= a]
        tokens = sum(len(r.tokens) for r in self.done)
        held = sum(w.sched.stats().num_held_blocks for w in self.workers)
        return {
            "requests": len(self.done),
            "ttft_ms_p50": percentile(ttft, 50),
            "ttft_ms_p99": percentile(ttft, 99),
            "itl_ms_p50": percentile(itl, 50),
            "itl_ms_p99": percentile(itl, 99),
            "token_itl_ms_p50": percentile(gaps, 50),
            "token_itl_ms_p99": percentile(gaps, 99),
            "token_itl_ms_p999": percentile(gaps, 99.9),
            "output_tokens_per_s": tokens / self.now if self.now else 0.0,
            "prefilled_locally": (
                1 - sum(self.placements) / len(self.placements) if self.placements else 1.0
            ),
            "blocks_left_held": held,
        }


def simulate(fleet: str, workload: str, seeds: int) -> dict[str, object]:
    runs = [Simulation(fleet, workload, seed).run() for seed in range(seeds)]
    out: dict[str, object] = {"fleet": fleet, "workload": workload, "seeds": seeds}
    for key in runs[0]:
        out[key] = round(statistics.fmean(r[key] for r in runs), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="long,short")
    p.add_argument("--fleets", default=",".join(FLEETS))
    p.add_argument("--seeds", type=int, default=3)
    args = p.parse_args(argv)
    results = [
        simulate(fleet, workload, args.seeds)
        for workload in args.workloads.split(",")
        for fleet in args.fleets.split(",")
    ]
    print(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
