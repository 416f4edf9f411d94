"""The measurements of an index-scale run, each on a running ``Env``: a fill, routes on an
idle index, a load cell (the event generator, the indexer and the router client at once, with an
optional stall probe, ``index_scale_probes``) and a backlog catch-up.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from base.process import Child
from router.kv.routing import WorkerPool
from schemas import encode
from schemas.kv_events import BlockStored, KvEventBatch
from tests.bench.index_scale_env import Env, go, wait_ready
from tests.bench.index_scale_fleet import Fleet, worker_id
from tests.bench.index_scale_measure import (
    CommandStats,
    CpuClock,
    LagSampler,
    RedisStats,
    SlowLogWatch,
    delta_calls,
    rss_bytes,
    split_redis_cpu,
    summary_ms,
)
from tests.bench.index_scale_router import closed_loop, plan
from tests.bench.loadgen import percentile
from tests.bench.procstat import self_cpu_seconds
from workers.kv_relay import KvRelay


@dataclass(frozen=True)
class Sizes:
    """What a configuration is run at (the flags of ``tests.bench.index_scale``)."""

    workers: int = 256
    holder_blocks: tuple[int, ...] = (1_000_000, 4_000_000)
    rate: float = 100_000  # block events/s the generator publishes in a load cell
    route_rate: float = 1_000  # routes/s of the router client
    cell_s: float = 20.0
    failover_s: float = 30.0
    backlog_events: int = 3_000_000
    idle_routes: int = 2_000
    sweep_pools: tuple[int, ...] = (16, 64, 256, 1024)
    sweep_prompts: tuple[int, ...] = (64, 512)
    prompt_blocks: int = 64
    service_ms: str = "2,6"
    seed: int = 0


class Probe(Protocol):
    """A stall provoked inside a load cell."""

    name: str

    async def prepare(self, run: Run) -> None:
        """Before the cell starts (the indexers it needs)."""

    async def act(self, run: Run, t0: float, seconds: float) -> None:
        """During the cell."""

    def window(self, run: Run, lag: LagSampler) -> tuple[float, float]:
        """The stall, in monotonic time (after the cell)."""

    def report(self) -> dict[str, Any]: ...


@dataclass
class Run:
    env: Env
    fleet: Fleet
    sizes: Sizes
    stats: RedisStats
    dir: Path
    holder_blocks: int = 0
    cpu: CpuClock | None = None
    t0: float = field(default_factory=time.monotonic)
    _cells: int = 0

    def log(self, **fields: Any) -> None:
        t = round(time.monotonic() - self.t0, 1)
        print(json.dumps({"t_s": t, **fields}), file=sys.stderr, flush=True)

    def pids(self) -> dict[str, int]:
        out = {name: pid for name, pid, _ in self.env.redis_nodes()}
        out |= {name: ix.pid for name, ix in self.env.indexers.items()}
        assert self.env.nats is not None
        out["nats-server"] = self.env.nats.pid
        return out

    def skip(self) -> str:
        return ",".join(str(int(w[1:])) for w in sorted(self.env.departed))

    def child(self, name: str, module: str, *args: str) -> Helper:
        """A generator or router process, started (it builds, then waits for ``go``)."""
        self._cells += 1
        d = self.dir / f"{self._cells:02d}-{name}"
        d.mkdir(parents=True)
        out, ready, go_ = d / "out.json", d / "ready", d / "go"
        argv = [sys.executable, "-m", f"tests.bench.{module}", *args]
        argv += ["--out", str(out), "--ready", str(ready), "--go", str(go_)]
        assert self.env.procs is not None
        return Helper(self.env.procs.start(f"{name}-{self._cells}", argv), out, ready, go_)

    def generator(self, name: str, rate: float, to_chain: int = 0, events: int = 0) -> Helper:
        """The generator of the chains up to ``to_chain``, or of ``events`` block events."""
        e = self.env
        what = ["--to-chain", str(to_chain)] if to_chain else ["--events", str(events)]
        return self.child(
            name, "index_scale_gen", "--nats", e.nats_url, "--prefix", e.prefix,
            "--spec", self.fleet.spec.to_json(), "--from-chain", str(self.fleet.next_chain),
            "--rate", str(rate), "--skip", self.skip(), *what,
        )  # fmt: skip

    def router(self, name: str, seconds: float) -> Helper:
        e, s = self.env, self.sizes
        return self.child(
            name, "index_scale_router", "--redis", e.redis_url, "--ns", e.ns,
            "--spec", self.fleet.spec.to_json(), "--chain", str(self.fleet.next_chain),
            "--rate", str(s.route_rate), "--seconds", str(seconds), "--pool", str(s.workers),
            "--prompt-blocks", str(s.prompt_blocks), "--service-ms", s.service_ms,
            "--skip", self.skip(), "--seed", str(s.seed + self._cells),
        )  # fmt: skip


@dataclass(frozen=True)
class Helper:
    """A generator or router process of a cell, and its files."""

    child: Child
    out: Path  # what it did, JSON
    ready: Path  # written when it has built its batches or calls
    go: Path  # written by the driver: the start time

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.out.read_text())
        return out


async def wait_exit(children: list[Child], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while any(c.proc.poll() is None for c in children):
        if time.monotonic() > deadline:
            raise TimeoutError("children still running")
        await asyncio.sleep(0.05)
    for c in children:
        if c.proc.returncode:
            raise RuntimeError(f"{c.name} failed, see {c.log_path}")


def _us(cpu_s: float, n: int) -> float:
    return round(cpu_s * 1e6 / n, 2) if n else 0.0


def _sum(by_process: dict[str, float], kind: str) -> float:
    return round(sum(v for k, v in by_process.items() if k.startswith(kind)), 2)


# ---------------------------------------------------------------------- fill and idle routes
async def fill(run: Run, to_chain: int) -> dict[str, Any]:
    """Publish the fleet's chains up to ``to_chain`` as fast as the generator can, the indexer
    applying them as they come; memory of Redis and the indexer before and after."""
    env = run.env
    ix_pids = [ix.pid for ix in env.indexers.values()]
    mem0, rss0 = run.stats.used_memory(), sum(rss_bytes(p) for p in ix_pids)
    g = run.generator("fill", 0, to_chain=to_chain)
    await wait_ready([g.ready], [g.child])
    before = await env.last_seq()
    cpu = CpuClock(run.pids())
    t0 = go([g.go])
    await wait_exit([g.child], 3600)
    gen = g.result()
    await env.wait_stored(before + gen["batches"])
    t_done = await env.drain()
    cpu_s = cpu.read()
    run.fleet.advance(gen["to_chain"])
    run.holder_blocks += gen["block_events"]
    mem1, rss1 = run.stats.used_memory(), sum(rss_bytes(p) for p in ix_pids)
    redis_b, ix_b = mem1 - mem0, rss1 - rss0
    return {
        "holder_blocks": run.holder_blocks,
        "block_events": gen["block_events"],
        "fill_s": round(t_done - t0, 2),
        "fill_block_events_per_s": round(gen["block_events"] / (t_done - t0)),
        "redis_used_memory_bytes": [mem0, mem1],
        "indexer_rss_bytes": [rss0, rss1],
        "added_redis_bytes_per_holder_block": round(redis_b / gen["block_events"], 1),
        "added_indexer_bytes_per_holder_block": round(ix_b / gen["block_events"], 1),
        "cpu_s": cpu_s,
    }


async def idle_routes(
    run: Run, pool_size: int, prompt_blocks: int, n: int, tag: str
) -> dict[str, Any]:
    """``n`` routes one after another on an idle index: latency at the client, Redis µs per
    route (inside EVALSHA, from INFO commandstats; and redis-server CPU)."""
    env, fleet = run.env, run.fleet
    index = await env.read_index()
    rng = random.Random(run.sizes.seed + pool_size + prompt_blocks)
    everyone = [worker_id(i) for i in range(max(pool_size, run.sizes.workers))]
    pool = WorkerPool(tuple(sorted(rng.sample(everyone, pool_size))))
    planned = plan(fleet, pool, n, prompt_blocks, 0.0, rng.randrange(1 << 30))
    await index.load_table(fleet.spec.model)
    await closed_loop(index, fleet.spec.model, pool, planned[: min(100, n)], f"{tag}w")
    before = run.stats.commandstats()
    redis_cpu = CpuClock({name: pid for name, pid, _ in env.redis_nodes()})
    lat = await closed_loop(index, fleet.spec.model, pool, planned, tag)
    after = run.stats.commandstats()
    cpu = sum(redis_cpu.read().values())
    calls, usec = delta_calls(before, after, "evalsha")  # the routes (released afterwards)
    return {
        "pool": pool_size,
        "sampled": min(16, pool_size),
        "prompt_blocks": prompt_blocks,
        "routes": n,
        **summary_ms(lat, "route"),
        "redis_us_per_route": round(usec / max(calls, 1), 1),
        "redis_cpu_us_per_route": _us(cpu, n),
    }


# ---------------------------------------------------------------------- load cells
@dataclass
class Cell:
    """What a load cell recorded."""

    name: str
    seconds: float
    t0: float
    gen: dict[str, Any]  # the generator's result
    rt: dict[str, Any]  # the router client's
    lag: LagSampler
    cpu: dict[str, float]  # CPU seconds by process
    commands: tuple[dict[str, CommandStats], dict[str, CommandStats]]  # before, after
    slow: list[tuple[float, float, str]]
    t_applied: float  # when everything sent was applied (markers: an upper bound)


async def load_cell(run: Run, name: str, seconds: float, probe: Probe | None) -> dict[str, Any]:
    """The generator at ``rate`` block events/s and the router client at ``route_rate``
    routes/s for ``seconds``, against the running indexer(s) (or the probe's)."""
    env, s = run.env, run.sizes
    g = run.generator(name, s.rate, events=int(s.rate * seconds))
    r = run.router(name, seconds)
    await wait_ready([g.ready, r.ready], [g.child, r.child])
    if probe is not None:
        await probe.prepare(run)
    before = await env.last_seq()
    run.stats.reset()
    cmd0 = run.stats.commandstats()
    run.cpu = CpuClock(run.pids())
    driver0 = self_cpu_seconds()
    lag = LagSampler(env.tails, env.positions)
    lag.start()
    t0 = go([g.go, r.go])
    acting = asyncio.create_task(probe.act(run, t0, seconds)) if probe is not None else None
    watching = SlowLogWatch(run.stats)
    await wait_exit([g.child, r.child], seconds * 20 + 120)
    gen, rt = g.result(), r.result()
    await env.wait_stored(before + gen["batches"])
    t_applied = await env.drain()
    await lag.stop()
    cpu = run.cpu.read() | {"generator": gen["cpu_s"], "router_client": rt["cpu_s"]}
    cpu["driver"] = round(self_cpu_seconds() - driver0, 3)
    cmd1 = run.stats.commandstats()
    if acting is not None:  # e.g. until the sweeper is done
        await acting
    await watching.stop()
    run.fleet.advance(gen["to_chain"])
    slow = run.stats.slow_calls()
    cell = Cell(name, seconds, t0, gen, rt, lag, cpu, (cmd0, cmd1), slow, t_applied)
    out = report(cell, s)
    if probe is not None:
        a, b = probe.window(run, lag)
        out["probe"] = {**probe.report(), "window_s": round(b - a, 3), **in_window(cell, a, b)}
    return out


def report(c: Cell, s: Sizes) -> dict[str, Any]:
    gen, rt, cpu = c.gen, c.rt, c.cpu
    events, routes = gen["block_events"], rt["routes"]
    share = {n: split_redis_cpu(cpu[n], c.commands[0][n], v) for n, v in c.commands[1].items()}
    per_event = {n: _us(v["apply"], events) for n, v in share.items()}
    per_event |= {n: _us(v, events) for n, v in cpu.items() if n.startswith("indexer")}
    per_route = {n: _us(v["route"], routes) for n, v in share.items()}
    per_route["router_client"] = _us(rt["cpu_s"], routes)
    # when the index held all the generator sent: the first lag sample after it stopped
    caught = [t + ms / 1000 for t, ms in c.lag.samples if t >= gen["t_end"]]
    t_caught = min(caught, default=c.t_applied)
    return {
        "cell": c.name,
        "seconds": c.seconds,
        "target_block_events_per_s": s.rate,
        "published_block_events_per_s": round(events / (gen["t_end"] - gen["t_start"])),
        "ingest_block_events_per_s": round(events / (t_caught - gen["t_start"])),
        "block_events": events,
        "target_routes_per_s": s.route_rate,
        "routes": routes,
        "route_errors": len(rt["errors"]),
        **summary_ms(rt["total_ms"], "route"),
        "route_client_late_p50_ms": round(percentile(rt["start_ms"], 50), 3),
        "route_client_late_p99_ms": round(percentile(rt["start_ms"], 99), 3),
        **summary_ms(c.lag.between(c.t0, gen["t_end"]), "lag"),
        "applied_after_publish_ms": round((t_caught - gen["t_end"]) * 1000, 1),
        "max_redis_call_ms": c.slow[0][0] if c.slow else 0.0,
        "redis_calls_over_1ms": len(c.slow),
        "slowest_redis_calls": [{"ms": ms, "call": call} for ms, _, call in c.slow[:5]],
        "cpu_s": cpu,
        "cpu_us_per_block_event": {
            "redis": _sum(per_event, "redis"),
            "indexer": _sum(per_event, "indexer"),
        },
        "cpu_us_per_route": {
            "redis": _sum(per_route, "redis"),
            "router_client": per_route["router_client"],
        },
        "cpu_us_per_block_event_by_process": per_event,
        "cpu_us_per_route_by_process": per_route,
    }


def in_window(c: Cell, a: float, b: float) -> dict[str, Any]:
    """Route max, lag max and the slowest Redis call during a stall (the slow log's times are
    whole wall-clock seconds: calls in the seconds the window touches)."""
    rt = c.rt
    routes = [ms for due, ms in zip(rt["due_s"], rt["total_ms"], strict=True) if a <= due <= b]
    wall = time.time() - time.monotonic()
    lo, hi = int(a + wall), int(b + wall) + 1
    calls = [(ms, call) for ms, ts, call in c.slow if lo <= ts <= hi]
    return {
        "route_max_ms": round(max(routes, default=0.0), 3),
        "routes": len(routes),
        "lag_max_ms": round(max(c.lag.between(a, b), default=0.0), 1),
        "max_redis_call_ms": calls[0][0] if calls else 0.0,
        "max_redis_call": calls[0][1] if calls else "",
    }


def per_core(load: dict[str, Any], shards: int) -> dict[str, Any]:
    """What one core of Redis and one of the indexer sustain, from the µs per op of a load
    cell, and the shards' Redis together (one core each)."""
    ev, rt = load["cpu_us_per_block_event"], load["cpu_us_per_route"]

    def rate(us: float) -> int:
        return round(1e6 / us) if us else 0

    return {
        "redis_core_block_events_per_s": rate(ev["redis"]),
        "redis_core_routes_per_s": rate(rt["redis"]),
        "indexer_core_block_events_per_s": rate(ev["indexer"]),
        "shards": shards,
        "redis_block_events_per_s_all_shards": shards * rate(ev["redis"]),
        "redis_routes_per_s_all_shards": shards * rate(rt["redis"]),
    }


# ---------------------------------------------------------------------- backlog
async def backlog(run: Run, events: int) -> dict[str, Any]:
    """Indexers stopped, ``events`` block events of churn published, indexers started: the time
    until they have applied it all."""
    env = run.env
    env.stop_indexers()
    g = run.generator("backlog", 0, events=events)
    await wait_ready([g.ready], [g.child])
    before = await env.last_seq()
    go([g.go])
    await wait_exit([g.child], 3600)
    gen = g.result()
    run.fleet.advance(gen["to_chain"])
    await env.wait_stored(before + gen["batches"])
    seqs = await env.markers()
    pos0 = await env.positions()
    run.stats.reset()
    watching = SlowLogWatch(run.stats)
    redis = CpuClock({name: pid for name, pid, _ in env.redis_nodes()})
    t_start = time.monotonic()
    ixs = [
        env.start_indexer(f"indexer-{len(env.indexers)}", "--snapshot-every", "0")
        for _ in range(env.groups)
    ]
    ix = CpuClock({f"indexer-{i}": x.pid for i, x in enumerate(ixs)})  # from their start
    started_by = time.monotonic() + 120.0
    while True:  # the first group of batches applied
        if await env.positions() != pos0:
            break
        if time.monotonic() > started_by:  # a clear failure, not a hang
            raise TimeoutError("the indexers applied nothing of the backlog within 120 s")
        await asyncio.sleep(0.005)
    t_first = time.monotonic()
    t_done = await env.wait_applied(seqs)
    ix_cpu = sum(ix.read().values())
    redis_cpu = sum(redis.read().values())
    await watching.stop()
    slow = run.stats.slow_calls()
    n = gen["block_events"]
    return {
        "block_events": n,
        "batches": gen["batches"],
        "indexers": len(ixs),
        "catch_up_s": round(t_done - t_start, 2),
        "start_s": round(t_first - t_start, 2),
        "block_events_per_s": round(n / (t_done - t_start)),
        "block_events_per_s_applying": round(n / (t_done - t_first)),
        "cpu_us_per_block_event": {"redis": _us(redis_cpu, n), "indexer": _us(ix_cpu, n)},
        "max_redis_call_ms": slow[0][0] if slow else 0.0,
        "redis_calls_over_1ms": len(slow),
    }


async def add_workers(run: Run, upto: int) -> None:
    """Workers beyond the fleet's, up to ``upto``, registered and each holding one chain (one
    batch through its ``KvRelay``), so a pool of that many workers all have slots."""
    env, fleet = run.env, run.fleet
    assert env.nc is not None
    ids = [worker_id(i) for i in range(fleet.spec.workers, upto)]
    await env.register(ids)
    held = fleet.held_chains()
    rng = random.Random(run.sizes.seed)
    for w in ids:
        relay = KvRelay(fleet_hashing=True, branch_blocks=fleet.spec.branch_blocks)
        events = relay.relay([BlockStored(fleet.chains.blocks(rng.choice(held)), None)])
        batch = KvEventBatch(w, fleet.spec.model, 1, time.time(), tuple(events))
        await env.nc.publish(env.subjects.kv(fleet.spec.model, w), encode(batch))
    fleet.chains.forget_tails()
    await env.drain()
