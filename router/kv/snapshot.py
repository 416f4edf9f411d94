"""Snapshots of the prefix index, taken without pausing ingest, and their restore.

``export`` reads every shard's positions first, then each model's slot table and, shard by shard,
its blocks with ``HSCAN`` (``SCAN_COUNT`` fields a call: each call is short, the indexers' and
routers' calls run between them). What it reads is at least as new as the positions, and every
change to the index is a bit set or cleared (a clear renews the holder's slot), so an index
restored from it and replayed from those positions ends where the live index is (see
``schemas.kv_events.IndexSnapshot``). ``restore`` writes it into an empty index: the blocks, the
slot tables (slots found in bitmaps but not in a table are retired, for the sweeper), the
shards' copies and positions.

Each (model, shard)'s blocks are one ``BlocksSnapshot``, written as an object of its own, so
neither side holds more than one part in memory.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from router.kv.redis_index import RedisPrefixIndex, _s
from schemas.kv_events import BlocksSnapshot, IndexSnapshot, SlotTableSnapshot

SCAN_COUNT = 1000  # fields one HSCAN call returns about
WRITE_CHUNK = 1000  # fields one HSET of a restore writes

PutPart = Callable[[str, BlocksSnapshot], Awaitable[None]]
GetPart = Callable[[str], Awaitable[BlocksSnapshot]]


async def _positions(index: RedisPrefixIndex) -> tuple[dict[str, int], ...]:
    shards = await index.ready()
    out = []
    for s in shards.shards:
        raw = await s.redis.hgetall(s.keys.pos)
        out.append({_s(g): int(v) for g, v in raw.items()})
    return tuple(out)


async def _scan_blocks(redis: Any, key: str) -> AsyncIterator[tuple[bytes, bytes]]:
    cursor: int | bytes = 0
    while True:
        cursor, items = await redis.hscan(key, cursor, count=SCAN_COUNT)
        for field, value in items.items():
            yield field, value
        if cursor in (0, b"0", "0"):
            return


async def export(index: RedisPrefixIndex, put_part: PutPart, name: str) -> IndexSnapshot:
    """Write every (model, shard)'s blocks with ``put_part`` (objects ``{name}-...``) and return
    the manifest that names them."""
    shards = await index.ready()
    positions = await _positions(index)
    models = sorted(await index.models())
    tables = []
    for model in models:
        table = await index.book.load(model)
        tables.append(SlotTableSnapshot(model, dict(table), index.book.version.get(model, 0)))
    parts = []
    for model in models:
        for s in shards.shards:
            hashes = bytearray()
            bitmaps = []
            async for field, value in _scan_blocks(s.redis, s.keys.blocks(model)):
                hashes += field
                bitmaps.append(bytes(value))
            nohole = await s.redis.get(s.keys.nohole(model)) or b""
            part = f"{name}-{_token(model)}-{s.index}"
            await put_part(
                part, BlocksSnapshot(model, s.index, bytes(hashes), tuple(bitmaps), nohole)
            )
            parts.append(part)
    return IndexSnapshot(
        ts_s=time.time(),
        shards=shards.n,
        positions=positions,
        tables=tuple(tables),
        parts=tuple(parts),
    )


async def restore(index: RedisPrefixIndex, snap: IndexSnapshot, get_part: GetPart) -> None:
    """Load a snapshot into an empty index (then replay the stream from its positions)."""
    shards = await index.ready()
    if snap.shards != shards.n:
        raise ValueError(f"a snapshot of {snap.shards} shards, the index has {shards.n}")
    top: dict[str, int] = {t.model: max(t.slots.values(), default=-1) for t in snap.tables}
    for name in snap.parts:
        part = await get_part(name)
        s = shards[part.shard]
        key = s.keys.blocks(part.model)
        pipe = s.redis.pipeline(transaction=False)
        kv: list[bytes] = []
        for i, bitmap in enumerate(part.bitmaps):
            kv += (part.hashes[8 * i : 8 * i + 8], bitmap)
            top[part.model] = max(top.get(part.model, -1), 8 * len(bitmap) - 1)
            if len(kv) >= 2 * WRITE_CHUNK:
                pipe.hset(key, mapping=dict(zip(kv[::2], kv[1::2], strict=True)))
                kv = []
        if kv:
            pipe.hset(key, mapping=dict(zip(kv[::2], kv[1::2], strict=True)))
        if part.nohole:
            pipe.set(s.keys.nohole(part.model), part.nohole)
        await pipe.execute()
    now = int(time.time() * 1000)
    for table in snap.tables:
        k0 = shards[0].keys
        r0 = shards[0].redis
        m = table.model
        if table.slots:
            await r0.hset(k0.slot(m), mapping=table.slots)
            await r0.hset(k0.slotw(m), mapping={str(v): h for h, v in table.slots.items()})
            if any(" " in h for h in table.slots):
                await r0.hset(k0.slot(m), "~tiers", 1)
        await r0.set(k0.slotver(m), table.version + 1)
        await r0.set(k0.slotnext(m), top.get(m, -1) + 1)
        owned = set(table.slots.values())
        dead = [s for s in range(top.get(m, -1) + 1) if s not in owned]
        if dead:  # bits of holders gone since (or slots given while the snapshot was read)
            await r0.zadd(k0.slotdead(m), dict.fromkeys(map(str, dead), now))
        index.book.version[m] = table.version + 1
        index.book.slots[m] = dict(table.slots)
    await index.book.sync(force=True)
    for s, pos in zip(shards.shards, snap.positions, strict=True):
        if pos:
            await s.redis.hset(s.keys.pos, mapping=pos)
    index.reset()


def _token(model: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in model)
