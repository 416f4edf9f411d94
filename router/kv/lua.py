"""The Lua scripts of the Redis prefix index (``scripts/*.lua``, layout in ``keys``). Each runs
atomically on one shard, touches only that shard's keys (declared in ``KEYS``; the reservations a
route finds in the expiry set carry the same hash tag) and is bounded.

Block hashes cross the boundary as one binary argument, 8 raw big-endian bytes each, sliced in Lua
(a slice is a hash field as is: nothing else to build). ROUTE takes and returns msgpack
(``cmsgpack``) so its per-candidate columns cost no Lua string parsing.

Bounds: ``APPLY`` carries as many block events as the indexer packs into one call
(``redis_index.MAX_BLOCKS_PER_CALL``); ``ROUTE`` bisects the chains of prefix-closed holders
(about log2(n) block reads per distinct overlap) and walks the others' block by block, and scores
the router's sample and at most ``max_holders`` holders, whatever the fleet's size; ``SWEEP`` scans
a bounded number of fields a call; ``SYNC_SLOTS`` writes a slot table (two fields per worker);
``MATCH`` (diagnostics only) reads every holder. Lua in Redis costs 0.1-0.4 µs per C call or
table operation here, so the loops are written to do as little as they can.
"""

from __future__ import annotations

from importlib.resources import files


def _script(name: str) -> str:
    return files("router.kv.scripts").joinpath(f"{name}.lua").read_text()


_COMMON = _script("common")


def _with_common(name: str) -> str:
    return _COMMON + "\n" + _script(name)


APPLY = _with_common("apply")
MATCH = _with_common("match")
ROUTE = _with_common("route")
RELEASE = _with_common("release")
SLOTS = _with_common("slots")
SYNC_SLOTS = _with_common("sync_slots")
SWEEP = _with_common("sweep")
FREE_SLOTS = _with_common("free_slots")
