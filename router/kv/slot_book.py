"""The slot table of the prefix index, as the indexer writes it and the routers read it.

A holder's slot is its bit in the holder bitmaps (``keys``). Shard 0 keeps the table's source and
its free lists (``SLOTS``: assign, retire, renew, each one small call); every other shard keeps a
copy that its routes read (``SYNC_SLOTS``: the whole table, two fields per holder, written when it
changed, at most every ``sync_every_s``). Retired slots wait in ``slotdead`` until the sweeper has
cleared their bits on every shard (``SWEEP``: ``HSCAN`` of ``sweep_count`` fields a call) and a
quiet time has passed (apply calls still in flight with an old slot land first); then they go
back to the free list (``FREE_SLOTS``).

A renewal is idempotent per stream sequence: a batch applied again after a restart (some shards
had it, some not) finds the holder renewed at that sequence and keeps its slot, so no shard
loses the blocks it stored under it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec

from router.kv import lua
from router.kv.shard_clients import RedisShards

ScriptCall = Callable[[int, str, Sequence[str], Sequence[Any]], Awaitable[Any]]

SWEEP_QUIET_MS = 2_000  # a slot retired this recently is not swept yet
SWEEP_COUNT = 256  # fields one sweep call scans (~0.2-0.5 ms of Redis here)

_reply = msgspec.msgpack.Decoder(tuple[int, tuple[int, ...]])


class SlotBook:
    def __init__(self, shards: RedisShards, script: ScriptCall, sync_every_s: float = 0.1):
        self.shards = shards
        self._script = script
        self.sync_every_s = sync_every_s
        self.slots: dict[str, dict[str, int]] = {}  # model -> holder -> slot (as written)
        self.version: dict[str, int] = {}
        self._renewed: dict[tuple[str, str], int] = {}  # (model, holder) -> seq renewed at
        self._synced: dict[str, int] = {}
        self._synced_at = 0.0

    def _keys0(self, model: str) -> list[str]:
        k = self.shards[0].keys
        return [
            k.slot(model),
            k.slotw(model),
            k.slotver(model),
            k.slotnext(model),
            k.slotfree(model),
            k.slotdead(model),
            k.nohole(model),
        ]

    async def load(self, model: str) -> dict[str, int]:
        """The table as shard 0 has it (an indexer taking over, a router's first look)."""
        k = self.shards[0].keys
        raw = await self.shards[0].hgetall(k.slot(model))
        ver = await self.shards[0].call("GET", k.slotver(model))
        table = {_s(h): int(s) for h, s in raw.items() if _s(h) != "~tiers"}
        self.slots[model] = table
        self.version[model] = int(ver or 0)
        return table

    async def _op(self, model: str, op: str, holders: Sequence[str]) -> tuple[int, ...]:
        now = int(time.time() * 1000)
        out = await self._script(0, lua.SLOTS, self._keys0(model), (op, now, *holders))
        version, slots = _reply.decode(out)
        self.version[model] = version
        table = self.slots.setdefault(model, {})
        for h, s in zip(holders, slots, strict=True):
            if s < 0:
                table.pop(h, None)
            else:
                table[h] = s
        return slots

    async def slots_of(self, model: str, holders: Sequence[str]) -> list[int]:
        """Each holder's slot, assigned if it has none."""
        table = self.slots.get(model)
        if table is None:
            table = await self.load(model)
        missing = [h for h in dict.fromkeys(holders) if h not in table]
        if missing:
            await self._op(model, "assign", missing)
        return [table[h] for h in holders]

    async def renew(self, model: str, holder: str, seq: int) -> int:
        """A fresh slot for a holder that starts empty (idempotent for a stream sequence)."""
        key = (model, holder)
        if seq and self._renewed.get(key) == seq and holder in self.slots.get(model, {}):
            return self.slots[model][holder]
        (slot,) = await self._op(model, "renew", [holder])
        if seq:
            self._renewed[key] = seq
        return slot

    async def retire(self, model: str, holders: Sequence[str]) -> None:
        if holders:
            await self._op(model, "retire", holders)
            for h in holders:
                self._renewed.pop((model, h), None)

    def dirty(self) -> bool:
        return any(self._synced.get(m) != v for m, v in self.version.items())

    async def sync(self, force: bool = False) -> None:
        """Copy changed tables to the other shards (at most every ``sync_every_s`` unless
        ``force``)."""
        if self.shards.n == 1 or not self.dirty():
            return
        now = time.monotonic()
        if not force and now - self._synced_at < self.sync_every_s:
            return
        self._synced_at = now
        for model, ver in list(self.version.items()):
            if self._synced.get(model) == ver:
                continue
            k0 = self.shards[0].keys
            raw = await self.shards[0].hgetall(k0.slot(model))
            source_ver = int(await self.shards[0].call("GET", k0.slotver(model)) or 0)
            dead = await self.shards[0].call("ZRANGE", k0.slotdead(model), 0, -1)
            flat: list[Any] = [source_ver, len(dead), *dead]
            for h, s in raw.items():
                flat += (h, s)
            for shard in self.shards.shards[1:]:
                k = shard.keys
                keys = [k.slot(model), k.slotw(model), k.slotver(model), k.nohole(model)]
                await self._script(shard.index, lua.SYNC_SLOTS, keys, flat)
            self._synced[model] = ver

    async def sweep(self, model: str) -> int:
        """Clear the bits of slots retired before the quiet time on every shard, then free
        them; returns how many. Each call is bounded (``SWEEP_COUNT`` fields); other clients'
        calls run between them."""
        k0 = self.shards[0].keys
        before = int(time.time() * 1000) - SWEEP_QUIET_MS
        dead = [
            int(s)
            for s in await self.shards[0].call("ZRANGEBYSCORE", k0.slotdead(model), 0, before)
        ]
        if not dead:
            return 0
        for shard in self.shards.shards:
            k = shard.keys
            cursor = "0"
            while True:
                cursor = _s(
                    await self._script(
                        shard.index,
                        lua.SWEEP,
                        [k.blocks(model), k.nohole(model)],
                        (cursor, SWEEP_COUNT, *dead),
                    )
                )
                if cursor == "0":
                    break
        freed = await self._script(
            0, lua.FREE_SLOTS, [k0.slotdead(model), k0.slotfree(model)], dead
        )
        return int(freed)


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v
