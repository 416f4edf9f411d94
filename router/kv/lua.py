"""The Lua scripts of the Redis prefix index (``scripts/*.lua``, layout in ``keys``). Each runs
atomically and is bounded.

Keys are derived inside the scripts from the ``ns`` argument (``KvKeys.base``; single-node Redis
or Sentinel, not Redis Cluster). Block hashes cross the boundary as one binary argument, 8 raw
big-endian bytes each, sliced in Lua (a slice is a hash field as is: nothing else to build).
Numbers cross as strings where Lua would truncate them; ROUTE takes and returns msgpack
(``cmsgpack``) so its per-candidate columns cost no Lua string parsing.

Bounds: ``APPLY_MANY`` carries as many block events as the caller packs into one call (the
indexer caps a call at ``redis_index.MAX_BLOCKS_PER_CALL``; 3-4 µs of Redis time per block event
here). ``MATCH`` / ``ROUTE`` bisect the chains of prefix-closed workers (about log2(n) block reads
per distinct overlap) and walk the others' block by block, in growing chunks that stop when none
of them still matches. Lua in Redis costs 0.1-0.4 µs per C call or table operation here, so the
per-candidate loops (64 workers) are written to do as little as they can.
"""

from __future__ import annotations

from importlib.resources import files


def _script(name: str) -> str:
    return files("router.kv.scripts").joinpath(f"{name}.lua").read_text()


_COMMON = _script("common")


def _with_common(name: str) -> str:
    return _COMMON + "\n" + _script(name)


APPLY_MANY = _with_common("apply_many")
DROP_WORKER = _with_common("drop_worker")
MATCH = _with_common("match")
ROUTE = _with_common("route")
RELEASE = _with_common("release")
