"""Where each shard of the prefix index lives, and a connection to it.

On a single Redis (or the primary of a Sentinel set) every shard is on that server: one client,
one lean pipe. On a Redis Cluster each shard's hash tag is chosen to fall in node ``i``'s slots
of the even split (``base.redis_slots``), and each shard gets a plain client and a lean pipe to
the node that owns its slot (found with ``CLUSTER SLOTS``): every call of a shard touches one slot,
so no cluster-aware client is needed on the hot path, and the cluster routes nothing. A node that
moved a slot answers ``MOVED``: ``refresh`` reads the slot map again.

How many shards the index has is recorded in Redis (``layout``, under a tag of its own) by the
first component that asks, from its setting or, by default, one per cluster master (1 without a
cluster); a component set to another count refuses to start (the count is part of where every
block lives: changing it needs a new namespace and a rebuild from the stream and the workers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog
from redis.asyncio import ConnectionPool, Redis
from redis.exceptions import NoPermissionError

from base.redis_slots import key_slot, slot_range, tag_for_range
from router.kv.keys import LAYOUT, ShardKeys
from router.kv.resp import RespPipe

log = structlog.get_logger("jetfleet.kv.shards")


class ShardCountMismatchError(RuntimeError):
    """The index was laid out with another number of shards than this component was told."""


@dataclass
class Shard:
    index: int
    keys: ShardKeys
    redis: Any  # a redis-py asyncio client of the node holding the shard
    pipe: RespPipe | None  # the lean pipe to it (None: redis-py only, e.g. TLS)

    async def call(self, *args: Any) -> Any:
        """One command, on the lean pipe when there is one (its replies come within its call
        timeout: a host gone without a reset fails the call instead of hanging it)."""
        if self.pipe is not None:
            return await self.pipe.call(*args)
        return await self.redis.execute_command(*args)

    async def hgetall(self, key: str) -> dict[bytes, bytes]:
        raw = await self.call("HGETALL", key)
        if isinstance(raw, dict):
            return raw
        return dict(zip(raw[::2], raw[1::2], strict=True))


def shard_tags(n: int) -> list[str]:
    """The hash tag of each of ``n`` shards (without braces): in node i's even slot range."""
    return [tag_for_range(f"s{n}", *slot_range(i, n)).strip("{}") for i in range(n)]


class RedisShards:
    def __init__(self, redis: Any, ns: str, n_shards: int = 0, lean: bool = True) -> None:
        """``redis``: a client of the server, or of any node of a cluster; ``n_shards`` 0: as
        recorded in Redis, else one per cluster master (1 without a cluster)."""
        self.seed = redis
        self.ns = ns
        self.wanted = n_shards
        self.lean = lean
        self.cluster = False
        self.shards: list[Shard] = []
        self._clients: dict[tuple[str, int], Any] = {}

    @property
    def n(self) -> int:
        return len(self.shards)

    def __getitem__(self, i: int) -> Shard:
        return self.shards[i]

    @property
    def ready(self) -> bool:
        return bool(self.shards)

    def layout_key(self) -> str:
        return f"{self.ns}:{LAYOUT}:{{{self.ns}:layout}}:shards"

    async def resolve(self, record: bool = False) -> None:
        """Find out the layout and connect to each shard's node (idempotent); ``record``: write
        the shard count when none is recorded (an indexer; routers only read it)."""
        if self.shards:
            return
        try:
            info = await self.seed.info("cluster")
            self.cluster = bool(int(info.get("cluster_enabled", 0) or 0))
        except NoPermissionError:  # a user without INFO (a router's ACL): not a cluster
            self.cluster = False
        slots = await self._slot_map() if self.cluster else []
        masters = len({node for _, _, node in slots}) or 1
        layout = self._client_for_key(self.layout_key(), slots)
        n = self.wanted or masters
        if record:
            await layout.set(self.layout_key(), n, nx=True)
        found = await layout.get(self.layout_key())
        recorded = int(found) if found is not None else n
        if self.wanted and recorded != self.wanted:
            raise ShardCountMismatchError(
                f"the prefix index in {self.ns} has {recorded} shards, not {self.wanted}: use "
                "another subject prefix (a new index) to change the count"
            )
        shards = []
        for i, tag in enumerate(shard_tags(recorded)):
            keys = ShardKeys(self.ns, tag)
            client = self._client_for_key(keys.pos, slots)
            pipe = (RespPipe.for_client(client) if self.lean else None) if client else None
            shards.append(Shard(i, keys, client, pipe))
        # shards on one server share its pipe: one connection, auto-pipelined together
        by_client: dict[int, RespPipe | None] = {}
        for s in shards:
            s.pipe = by_client.setdefault(id(s.redis), s.pipe)
        self.shards = shards
        log.info("kv_index_shards", shards=recorded, cluster=self.cluster)

    async def refresh(self) -> None:
        """Read the cluster's slot map again (a slot moved): the next calls go to its node."""
        if not self.cluster:
            return
        for s in self.shards:
            if s.pipe is not None:
                s.pipe.close()
        self.shards = []
        await self.resolve(record=False)

    async def _slot_map(self) -> list[tuple[int, int, tuple[str, int]]]:
        raw = await self.seed.execute_command("CLUSTER SLOTS")
        out = []
        for entry in raw:
            host, port = entry[2][0], int(entry[2][1])
            host = host.decode() if isinstance(host, bytes) else host
            out.append((int(entry[0]), int(entry[1]), (host or "127.0.0.1", port)))
        return out

    def _client_for_key(self, key: str, slots: list[tuple[int, int, tuple[str, int]]]) -> Any:
        if not self.cluster:
            return self.seed
        slot = key_slot(key)
        for lo, hi, node in slots:
            if lo <= slot <= hi:
                return self._client(node)
        raise RuntimeError(f"no node of the cluster serves slot {slot}")

    def _client(self, node: tuple[str, int]) -> Any:
        client = self._clients.get(node)
        if client is None:
            seed_pool = self.seed.connection_pool
            kw = dict(seed_pool.connection_kwargs)
            kw.update(host=node[0], port=node[1], db=0)
            pool = ConnectionPool(connection_class=seed_pool.connection_class, **kw)
            client = self._clients[node] = Redis(connection_pool=pool)
        return client

    async def aclose(self) -> None:
        for s in self.shards:
            if s.pipe is not None:
                s.pipe.close()
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()
