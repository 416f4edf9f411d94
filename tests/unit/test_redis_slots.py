"""Redis Cluster's key -> slot map computed in Python (``base.redis_slots``), against the values a
real redis-server 6.2 answers to ``CLUSTER KEYSLOT`` (the first ones are the Redis docs'
examples); ``tests/integration/test_redis_cluster.py`` compares hundreds of random keys live."""

from __future__ import annotations

import itertools

import pytest

from base.redis_slots import SLOTS, crc16, hashed_part, key_slot, slot_range, tag_for_range

# key, CLUSTER KEYSLOT key (redis-server 6.2.14)
KNOWN_SLOTS: list[tuple[bytes | str, int]] = [
    ("somekey", 11058),  # CLUSTER KEYSLOT's documented examples
    ("foo{hash_tag}", 2515),
    ("foo", 12182),
    ("bar", 5061),
    ("hello", 866),
    ("{user1000}.following", 3443),  # the spec's hash tag example: one slot for both
    ("{user1000}.followers", 3443),
    ("foo{}{bar}", 8363),  # the first { closes at once: the whole key is hashed
    ("foo{{bar}}zap", 4015),  # hashes "{bar"
    ("foo{bar}{zap}", 5061),  # the first tag decides: slot of "bar"
    ("{}", 15257),
    ("{", 4092),
    ("}", 12090),
    ("", 0),
    ("a{b", 13340),  # no closing brace: whole key
    ("{a}}", 15495),
    ("é{ü}", 9552),  # a str is hashed as UTF-8
    (b"\xff\x00{\x80}", 4488),  # any bytes
]


@pytest.mark.parametrize(("key", "slot"), KNOWN_SLOTS)
def test_key_slot_is_what_redis_answers(key: bytes | str, slot: int) -> None:
    assert key_slot(key) == slot


def test_crc16_is_the_xmodem_variant() -> None:
    assert crc16(b"123456789") == 0x31C3  # the cluster spec's check value
    assert crc16(b"") == 0


@pytest.mark.parametrize(
    ("key", "part"),
    [
        (b"{user1000}.following", b"user1000"),
        (b"foo{}{bar}", b"foo{}{bar}"),
        (b"foo{{bar}}zap", b"{bar"),
        (b"foo{bar}{zap}", b"bar"),
        (b"plain", b"plain"),
        (b"}{x}", b"x"),  # a } before the first { does not count
    ],
)
def test_the_hashed_part_is_the_first_non_empty_tag(key: bytes, part: bytes) -> None:
    assert hashed_part(key) == part


@pytest.mark.parametrize("count", [1, 2, 3, 5, 7, 16384])
def test_the_even_split_covers_every_slot_once_in_order(count: int) -> None:
    ranges = [slot_range(i, count) for i in range(count)]
    assert ranges[0][0] == 0 and ranges[-1][1] == SLOTS
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    sizes = {hi - lo for lo, hi in ranges}
    assert max(sizes) - min(sizes) <= 1


def test_three_nodes_split_as_redis_cli_would() -> None:
    assert [slot_range(i, 3) for i in range(3)] == [(0, 5461), (5461, 10922), (10922, 16384)]


@pytest.mark.parametrize(("index", "count"), [(3, 3), (-1, 3), (0, 0), (0, SLOTS + 1)])
def test_no_range_for_a_node_that_is_not_there(index: int, count: int) -> None:
    with pytest.raises(ValueError, match="no node"):
        slot_range(index, count)


@pytest.mark.parametrize(
    ("prefix", "lo", "hi"),
    [("kv", 0, 5461), ("kv", 5461, 10922), ("kv", 10922, 16384), ("idx", 100, 101), ("a", 0, 1)],
)
def test_the_tag_is_the_first_that_lands_in_the_range(prefix: str, lo: int, hi: int) -> None:
    tag = tag_for_range(prefix, lo, hi)
    k = int(tag.removeprefix(f"{{{prefix}.").removesuffix("}"))
    assert tag == f"{{{prefix}.{k}}}"
    assert lo <= key_slot(tag) < hi
    assert lo <= key_slot(f"{tag}:blocks:42") < hi  # every key carrying the tag
    assert all(not lo <= key_slot(f"{{{prefix}.{j}}}") < hi for j in range(k))  # the smallest


def test_a_tag_per_shard_of_an_even_split() -> None:
    tags = [tag_for_range("kv", *slot_range(i, 3)) for i in range(3)]
    assert tags == ["{kv.3}", "{kv.2}", "{kv.0}"]
    assert len({key_slot(t) for t in tags}) == 3


@pytest.mark.parametrize(
    ("prefix", "lo", "hi"),
    [("a}", 0, 10), ("{a", 0, 10), ("a", 5, 5), ("a", -1, 3), ("a", 0, 16385)],
)
def test_a_tag_needs_a_plain_prefix_and_a_real_range(prefix: str, lo: int, hi: int) -> None:
    with pytest.raises(ValueError):
        tag_for_range(prefix, lo, hi)
