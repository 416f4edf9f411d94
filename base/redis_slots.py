"""Redis Cluster's key space, computed here: which of the 16384 hash slots a key lives in, the
even split of the slots over N nodes, and hash tags chosen to land in a given node's range.

Redis Cluster (https://redis.io/docs/reference/cluster-spec/#key-distribution-model) maps a
key to ``CRC16(k) mod 16384``, CRC16 being the XMODEM variant (polynomial 0x1021, initial value
0, no reflection: ``CRC16("123456789") == 0x31C3``). ``k`` is the whole key, unless the key holds
a hash tag: a ``{`` with a ``}`` somewhere to its right and at least one byte between the first
``{`` and the first ``}`` after it. Then ``k`` is only those bytes, so ``{user1}.a`` and
``{user1}.b`` share a slot (and a node, and one Lua script may touch both). The first such pair
decides: ``foo{}{bar}`` hashes whole (the first ``{`` closes at once), ``foo{{bar}}`` hashes
``{bar``, ``foo{bar}{zap}`` hashes ``bar``.

A sharded index gives shard ``i`` of ``n`` the tag ``tag_for_range(prefix, *slot_range(i, n))``:
every key of the shard then sits in node ``i``'s slots when the cluster was formed with the even
split (``infra.embedded_cluster`` forms it so). Pure: no I/O.
"""

from __future__ import annotations

SLOTS = 16384  # hash slots of a Redis Cluster
_TAG_SEARCH_LIMIT = 1 << 22  # candidates tried before giving up (a one-slot range needs ~16k)


def _crc16_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
        table.append(crc & 0xFFFF)
    return tuple(table)


_CRC16 = _crc16_table()


def crc16(data: bytes) -> int:
    """CRC16-XMODEM (CCITT polynomial 0x1021, initial value 0), as Redis Cluster computes it."""
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[((crc >> 8) ^ byte) & 0xFF]
    return crc


def hashed_part(key: bytes) -> bytes:
    """The bytes of ``key`` that decide its slot: the hash tag's content, else the whole key."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def key_slot(key: bytes | str) -> int:
    """The hash slot (0..16383) of ``key`` (a ``str`` is hashed as UTF-8): ``CLUSTER KEYSLOT``."""
    raw = key.encode() if isinstance(key, str) else key
    return crc16(hashed_part(raw)) % SLOTS


def slot_range(index: int, count: int) -> tuple[int, int]:
    """Node ``index`` of ``count``'s slots in the even split, as ``[lo, hi)``: the slots in order,
    ``lo = index * 16384 // count``."""
    if not 0 <= index < count or count > SLOTS:
        raise ValueError(f"no node {index} of {count} (1 to {SLOTS} nodes)")
    return index * SLOTS // count, (index + 1) * SLOTS // count


def tag_for_range(prefix: str, lo: int, hi: int) -> str:
    """The hash tag ``{prefix.<k>}`` with the smallest ``k >= 0`` whose slot is in ``[lo, hi)``.

    Deterministic: every process computes the same tag for the same shard. ``prefix`` may hold
    neither ``{`` nor ``}`` (the tag would end, or start, inside it)."""
    if "{" in prefix or "}" in prefix:
        raise ValueError(f"a hash tag prefix without braces, not {prefix!r}")
    if not 0 <= lo < hi <= SLOTS:
        raise ValueError(f"a slot range within [0, {SLOTS}), not [{lo}, {hi})")
    for k in range(_TAG_SEARCH_LIMIT):
        if lo <= crc16(f"{prefix}.{k}".encode()) % SLOTS < hi:
            return f"{{{prefix}.{k}}}"
    raise LookupError(f"no tag {{{prefix}.k}} in slots [{lo}, {hi}) for k < {_TAG_SEARCH_LIMIT}")
