"""The KV cache sized from a memory budget: the arithmetic, the size parser, the one-of-three rule and the refusal
of a budget that cannot hold one sequence (llm/kv_budget.py, pure)."""

import pytest

from mindspore_serving.llm.kv_budget import (
    FRACTION,
    MEMORY,
    NUM_BLOCKS,
    CacheGeometry,
    KvBudgetError,
    KvCacheBudget,
    KvCacheCapacity,
    choose_budget,
    fraction_budget,
    kv_cache_blocks,
    parse_size,
)

# the bundled tiny LLaMA's rank: 4 layers, 2 KV heads of 32, blocks of 16 tokens, float32
TINY = {"block_size": 16, "max_seq_len": 256, "cache": {"num_layers": 4, "num_kv_heads": 2, "head_dim": 32}}
TINY_BLOCK = 4 * 2 * 16 * 2 * 32 * 4  # layers * (K, V) * tokens * heads * head_dim * float32 = 32 KiB


@pytest.mark.parametrize(
    "text, size",
    [
        (4096, 4096),
        ("4096", 4096),
        ("2GiB", 2 << 30),
        ("512MiB", 512 << 20),
        ("1.5GB", 1_500_000_000),
        (" 2 gib ", 2 << 30),
        ("64KiB", 65536),
        ("3kb", 3000),
        ("1.5B", 1),
        ("0.5MiB", 1 << 19),
        ("1T", 10**12),
    ],
)
def test_sizes_parse_to_bytes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("value", ["2 GiB extra", "lots", "2Gb/s", "", "1.2.3GB", "-1GiB", 0, -5, True, 1.5, None])
def test_bad_sizes_are_refused(value):
    with pytest.raises(KvBudgetError, match="kv_cache_memory"):
        parse_size(value)


def test_blocks_follow_from_the_budget():
    assert CacheGeometry.from_manifest(TINY).block_bytes == TINY_BLOCK
    assert kv_cache_blocks(TINY, 256, 16 << 20) == 512  # the bundled config's num_blocks in 16 MiB
    assert kv_cache_blocks(TINY, 256, (16 << 20) + TINY_BLOCK - 1) == 512  # a partial block is not a block
    half = dict(TINY, cache=dict(TINY["cache"], dtype="float16"))
    assert kv_cache_blocks(half, 256, 16 << 20) == 1024
    rank_of_two = dict(TINY, cache=dict(TINY["cache"], num_kv_heads=1))  # TP=2: the rank's manifest has 1 head
    assert kv_cache_blocks(rank_of_two, 256, 16 << 20) == 1024


def test_too_little_memory_for_one_sequence_is_refused():
    need = (16 + 1) * TINY_BLOCK  # 16 blocks of a sequence of 256 tokens (its last is never cached) + scratch
    assert kv_cache_blocks(TINY, 256, need) == 17
    with pytest.raises(
        KvBudgetError,
        match=f"^too little memory for even one sequence: {need} bytes needed for "
        f"max_model_len=256, kv_cache_memory is {need - 1}$",
    ):
        kv_cache_blocks(TINY, 256, need - 1)
    assert kv_cache_blocks(TINY, 64, need - 1) == 16  # a shorter max_model_len fits


@pytest.mark.parametrize(
    "manifest, message",
    [
        ({"block_size": 16}, "no 'cache' section"),
        ({"cache": TINY["cache"]}, "lacks a valid cache geometry"),
        (dict(TINY, cache=dict(TINY["cache"], dtype="int4")), "dtype 'int4' is not one of"),
        (dict(TINY, cache=dict(TINY["cache"], head_dim=0)), "empty cache geometry"),
    ],
)
def test_bad_manifests_are_named(manifest, message):
    with pytest.raises(KvBudgetError, match=message):
        kv_cache_blocks(manifest, 256, 1 << 30)


def test_exactly_one_way_of_sizing():
    assert choose_budget({}) == KvCacheBudget(NUM_BLOCKS)
    assert choose_budget({"num_blocks": 64}) == KvCacheBudget(NUM_BLOCKS)
    assert choose_budget({MEMORY: "1MiB"}) == KvCacheBudget(MEMORY, 1 << 20)
    assert choose_budget({FRACTION: 0.5}) == KvCacheBudget(FRACTION, 0.5)
    with pytest.raises(
        KvBudgetError,
        match="give only one of engine.num_blocks, engine.kv_cache_memory and "
        "engine.kv_cache_memory_fraction .* got num_blocks and kv_cache_memory",
    ):
        choose_budget({"num_blocks": 64, MEMORY: "1MiB"})
    with pytest.raises(KvBudgetError, match="got kv_cache_memory and kv_cache_memory_fraction"):
        choose_budget({MEMORY: 1024, FRACTION: 0.5})
    for bad in (0, 1.5, "half", True):
        with pytest.raises(KvBudgetError, match=r"engine.kv_cache_memory_fraction must be a number in \(0, 1\]"):
            choose_budget({FRACTION: bad})


def test_fraction_of_shared_memory_less_weights():
    assert fraction_budget(0.5, 8 << 30, 1 << 30, ranks_sharing=2) == (3 << 30) // 2
    assert fraction_budget(0.1, 1 << 30, 1 << 30) < 0


def test_capacity_line():
    line = KvCacheCapacity(512, 16, 256, TINY_BLOCK).describe()
    assert line == (
        "KV cache: 512 blocks of 16 tokens, 8176 tokens (31 sequences of max_model_len=256) in 16.0 MiB per rank"
    )
    assert KvCacheCapacity(17, 16, 256).describe().endswith("(1 sequences of max_model_len=256) per rank")
