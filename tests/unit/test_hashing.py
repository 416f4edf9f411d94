"""Block hashing (``schemas.hashing``): full blocks only, chained, seeded by LoRA/namespace."""

from __future__ import annotations

import random
import struct

import pytest
import xxhash

from schemas.hashing import (
    SHALLOW_TAGS,
    block_hashes,
    branch_tag,
    chain_hash,
    check_branch_blocks,
    hash_seed,
    is_shallow,
    local_block_hashes,
)

BLOCK_SIZES = [1, 2, 4, 16, 64]
SEEDS = [0, hash_seed("lora-a"), hash_seed(namespace="tenant-1")]


def _tokens(n: int, seed: int = 7) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(0, 1 << 17) for _ in range(n)]


def _tagged(raw: int, tag: int) -> int:
    return (raw & ((1 << 56) - 1)) | (tag << 56)


def test_wire_format_is_pinned() -> None:
    """Little-endian u32 tokens, XXH3-64 seeded; chaining over two little-endian u64s; the top
    byte replaced by the branch tag (shallow depth, then the branch point's, then inherited)."""
    tokens, seed = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], 42
    local = [
        xxhash.xxh3_64_intdigest(struct.pack("<4I", *tokens[i : i + 4]), seed) for i in (0, 4, 8)
    ]
    assert local_block_hashes(tokens, 4, seed) == local
    # branch_blocks=2: block 0 is shallow (tag 0), block 1 is the branch point, block 2 inherits
    seq0 = _tagged(local[0], 0)
    raw1 = xxhash.xxh3_64_intdigest(struct.pack("<QQ", seq0, local[1]), seed)
    seq1 = _tagged(raw1, SHALLOW_TAGS + (raw1 >> 56) % (256 - SHALLOW_TAGS))
    raw2 = xxhash.xxh3_64_intdigest(struct.pack("<QQ", seq1, local[2]), seed)
    seq2 = _tagged(raw2, seq1 >> 56)
    assert block_hashes(tokens, 4, seed, branch_blocks=2) == [seq0, seq1, seq2]
    assert chain_hash(None, local[0], seed, 2) == seq0
    assert chain_hash(seq0, local[1], seed, 2) == seq1
    assert chain_hash(seq1, local[2], seed, 2) == seq2


@pytest.mark.parametrize("branch_blocks", [1, 2, 4, 7])
def test_a_chain_carries_its_branch_tag_from_the_branch_point_on(branch_blocks: int) -> None:
    tokens = _tokens(16 * 4)
    hashes = block_hashes(tokens, 4, branch_blocks=branch_blocks)
    tags = [branch_tag(h) for h in hashes]
    assert tags[: branch_blocks - 1] == list(range(branch_blocks - 1))  # shallow: their depth
    assert [is_shallow(h) for h in hashes] == [i < branch_blocks - 1 for i in range(16)]
    anchor = tags[branch_blocks - 1]
    assert anchor >= SHALLOW_TAGS and set(tags[branch_blocks - 1 :]) == {anchor}


def test_branch_tags_spread_over_the_tag_space() -> None:
    tags = {
        branch_tag(block_hashes(_tokens(8, seed=s), 4, branch_blocks=1)[0]) for s in range(4000)
    }
    assert len(tags) > 0.9 * (256 - SHALLOW_TAGS)
    assert min(tags) >= SHALLOW_TAGS


def test_prompts_sharing_the_branch_blocks_share_the_tag() -> None:
    head = _tokens(4 * 4, seed=11)
    a = block_hashes(head + _tokens(32, seed=1), 4, branch_blocks=4)
    b = block_hashes(head + _tokens(32, seed=2), 4, branch_blocks=4)
    assert a[:4] == b[:4] and a[4] != b[4]
    assert {branch_tag(h) for h in a[3:]} == {branch_tag(h) for h in b[3:]}


@pytest.mark.parametrize("branch_blocks", [0, 65])
def test_branch_blocks_is_bounded(branch_blocks: int) -> None:
    with pytest.raises(ValueError):
        check_branch_blocks(branch_blocks)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("seed", SEEDS)
def test_partial_blocks_are_ignored(block_size: int, seed: int) -> None:
    n_blocks = 5
    full = _tokens(n_blocks * block_size + block_size)
    expected = block_hashes(full[: n_blocks * block_size], block_size, seed)
    assert len(expected) == n_blocks
    for remainder in range(block_size):  # every partial tail length, none hashed
        tokens = full[: n_blocks * block_size + remainder]
        assert block_hashes(tokens, block_size, seed) == expected


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_fewer_tokens_than_a_block_hash_to_nothing(block_size: int) -> None:
    assert block_hashes(_tokens(block_size - 1), block_size) == []
    assert local_block_hashes([], block_size) == []


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shared_blocks", [0, 1, 3])
def test_shared_prefix_shares_exactly_the_leading_hashes(
    block_size: int, seed: int, shared_blocks: int
) -> None:
    total = 6
    a = _tokens(total * block_size, seed=1)
    b = list(a)
    b[shared_blocks * block_size] += 1  # first token of the first differing block
    ha, hb = block_hashes(a, block_size, seed), block_hashes(b, block_size, seed)
    assert ha[:shared_blocks] == hb[:shared_blocks]
    # chaining: every hash after the divergence differs, even where block contents agree again
    assert all(x != y for x, y in zip(ha[shared_blocks:], hb[shared_blocks:], strict=True))


@pytest.mark.parametrize("block_size", [2, 4, 16])
def test_last_token_of_a_block_matters(block_size: int) -> None:
    a = _tokens(3 * block_size)
    b = list(a)
    b[block_size - 1] += 1
    ha, hb = block_hashes(a, block_size), block_hashes(b, block_size)
    assert all(x != y for x, y in zip(ha, hb, strict=True))


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_same_block_elsewhere_has_same_local_but_different_chained_hash(block_size: int) -> None:
    block = _tokens(block_size, seed=3)
    tokens = block + _tokens(block_size, seed=4) + block
    local = local_block_hashes(tokens, block_size)
    chained = block_hashes(tokens, block_size)
    assert local[0] == local[2]
    assert chained[0] != chained[2]
    assert block_hashes(block, block_size, branch_blocks=1) != block_hashes(block, block_size)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("split_blocks", [1, 2, 4])
def test_continuing_from_a_parent_equals_hashing_the_whole(
    block_size: int, split_blocks: int
) -> None:
    tokens = _tokens(5 * block_size + 1)
    whole = block_hashes(tokens, block_size, 9)
    head = block_hashes(tokens[: split_blocks * block_size], block_size, 9)
    tail = block_hashes(tokens[split_blocks * block_size :], block_size, 9, parent=head[-1])
    assert head + tail == whole


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_different_seed_gives_different_hashes(block_size: int) -> None:
    tokens = _tokens(4 * block_size)
    per_seed = [block_hashes(tokens, block_size, s) for s in SEEDS]
    for i, a in enumerate(per_seed):
        for b in per_seed[i + 1 :]:
            assert all(x != y for x, y in zip(a, b, strict=True))


def test_lora_and_namespace_fold_into_the_seed() -> None:
    assert hash_seed() == 0
    assert hash_seed(None, None) == hash_seed("", "") == 0
    seeds = {
        hash_seed("lora-a"),
        hash_seed("lora-b"),
        hash_seed(namespace="lora-a"),
        hash_seed("lora-a", "tenant-1"),
        hash_seed("lora-a", "tenant-2"),
    }
    assert len(seeds) == 5 and 0 not in seeds
    assert hash_seed("lora-a") == hash_seed("lora-a")  # stable, not per process
    tokens = _tokens(32)
    assert block_hashes(tokens, 16, hash_seed("lora-a")) != block_hashes(tokens, 16)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_hashes_are_u64(block_size: int) -> None:
    for h in block_hashes(_tokens(8 * block_size), block_size, hash_seed("x")):
        assert 0 <= h < 1 << 64


def test_hashes_accept_tuples_and_lists_alike() -> None:
    tokens = _tokens(48)
    assert block_hashes(tuple(tokens), 16) == block_hashes(tokens, 16)


@pytest.mark.parametrize("block_size", [0, -4])
def test_block_size_must_be_positive(block_size: int) -> None:
    with pytest.raises(ValueError):
        block_hashes([1, 2, 3], block_size)
