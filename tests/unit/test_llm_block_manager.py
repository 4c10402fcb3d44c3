"""BlockManager: allocation, ref counts, prefix caching (chained hashes, LRU eviction)."""

import pytest

from mindspore_serving.llm.block_manager import BlockManager, hash_block
from mindspore_serving.llm.model_io import SCRATCH_BLOCK
from mindspore_serving.llm.request import Request
from mindspore_serving.llm.sampling_params import SamplingParams

BS = 4


def make_request(request_id, tokens):
    return Request(request_id, tokens, SamplingParams(max_new_tokens=8, temperature=0), arrival_time=0.0)


def computed(manager, request, num_tokens):
    """Pretends a step computed the request's first `num_tokens` tokens."""
    request.num_computed_tokens = num_tokens
    manager.cache_full_blocks(request)


def test_allocate_append_free_counts():
    bm = BlockManager(num_blocks=9, block_size=BS)
    assert bm.num_usable_blocks == 8 and bm.num_free_blocks == 8 and bm.usage == 0.0
    req = make_request("a", range(10))
    assert bm.allocate(req, 10)
    assert len(req.block_table) == 3 and len(set(req.block_table)) == 3
    assert SCRATCH_BLOCK not in req.block_table
    assert bm.num_free_blocks == 5 and bm.usage == pytest.approx(3 / 8)
    req.num_computed_tokens = 10
    assert bm.append_slots(req, 2)  # positions 10, 11 still fit in block 3
    assert len(req.block_table) == 3
    req.num_computed_tokens = 12
    assert bm.append_slots(req, 1)  # position 12 opens a 4th block
    assert len(req.block_table) == 4 and bm.num_free_blocks == 4
    bm.free(req)
    assert req.block_table == [] and bm.num_free_blocks == 8
    assert all(bm.ref_count(b) == 0 for b in range(9))


def test_scratch_block_is_never_handed_out():
    bm = BlockManager(num_blocks=5, block_size=BS)
    reqs = [make_request(str(i), range(4)) for i in range(4)]
    for req in reqs:
        assert bm.allocate(req, 4)
    assert sorted(b for r in reqs for b in r.block_table) == [1, 2, 3, 4]
    assert bm.num_free_blocks == 0


def test_short_pool_changes_nothing():
    bm = BlockManager(num_blocks=4, block_size=BS)
    big = make_request("big", range(13))
    assert not bm.can_allocate(big, 13)
    assert not bm.allocate(big, 13)
    assert big.block_table == [] and bm.num_free_blocks == 3
    small = make_request("small", range(12))
    assert bm.allocate(small, 12)
    small.num_computed_tokens = 12
    assert not bm.can_append_slots(small, 1)
    assert not bm.append_slots(small, 1)
    assert len(small.block_table) == 3


def test_allocate_twice_is_a_bug():
    bm = BlockManager(num_blocks=8, block_size=BS)
    req = make_request("a", range(4))
    bm.allocate(req, 4)
    with pytest.raises(RuntimeError, match="already holds blocks"):
        bm.allocate(req, 4)


def test_hash_is_chained_over_the_prefix():
    first = hash_block(None, [1, 2, 3, 4])
    assert hash_block(first, [5, 6, 7, 8]) != hash_block(hash_block(None, [9, 9, 9, 9]), [5, 6, 7, 8])
    assert hash_block(first, [5, 6, 7, 8]) == hash_block(hash_block(None, [1, 2, 3, 4]), [5, 6, 7, 8])


def test_prefix_blocks_are_shared_with_ref_counts():
    bm = BlockManager(num_blocks=16, block_size=BS, enable_prefix_caching=True)
    a = make_request("a", list(range(10)))
    assert bm.allocate(a, 10)
    computed(bm, a, 10)
    assert bm.num_cached_blocks == 2  # two full blocks; the partial third is not cached

    b = make_request("b", list(range(8)) + [50, 51, 52])
    blocks, num_tokens = bm.get_computed_blocks(b)
    assert blocks == a.block_table[:2] and num_tokens == 8
    free_before = bm.num_free_blocks
    assert bm.allocate(b, 3, blocks)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] not in a.block_table
    assert bm.num_free_blocks == free_before - 1  # only the new block came from the pool
    assert [bm.ref_count(x) for x in a.block_table] == [2, 2, 1]
    assert bm.prefix_cache_queries == 10 + 11 and bm.prefix_cache_hits == 8

    bm.free(a)
    assert [bm.ref_count(x) for x in b.block_table] == [1, 1, 1]
    bm.free(b)
    assert bm.num_free_blocks == 15


def test_no_hit_when_an_earlier_block_differs():
    bm = BlockManager(num_blocks=16, block_size=BS, enable_prefix_caching=True)
    a = make_request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    bm.allocate(a, 9)
    computed(bm, a, 9)
    c = make_request("c", [0, 2, 3, 4, 5, 6, 7, 8, 9])  # same second block, other first block
    assert bm.get_computed_blocks(c) == ([], 0)


def test_the_last_token_is_always_computed():
    bm = BlockManager(num_blocks=16, block_size=BS, enable_prefix_caching=True)
    a = make_request("a", list(range(12)))
    bm.allocate(a, 12)
    computed(bm, a, 12)
    same = make_request("same", list(range(8)))  # its whole prompt is cached, in two blocks
    blocks, num_tokens = bm.get_computed_blocks(same)
    assert len(blocks) == 1 and num_tokens == 4


def test_blocks_are_cached_only_once_computed():
    bm = BlockManager(num_blocks=16, block_size=BS, enable_prefix_caching=True)
    a = make_request("a", list(range(9)))
    bm.allocate(a, 9)
    bm.cache_full_blocks(a)  # nothing computed yet
    assert bm.num_cached_blocks == 0
    computed(bm, a, 5)
    assert bm.num_cached_blocks == 1
    computed(bm, a, 9)
    assert bm.num_cached_blocks == 2


def test_without_prefix_caching_nothing_is_shared():
    bm = BlockManager(num_blocks=16, block_size=BS)
    a = make_request("a", list(range(9)))
    bm.allocate(a, 9)
    computed(bm, a, 9)
    assert bm.num_cached_blocks == 0
    assert bm.get_computed_blocks(make_request("b", list(range(9)))) == ([], 0)


def test_freed_cached_blocks_stay_hittable_and_count_as_free():
    bm = BlockManager(num_blocks=5, block_size=BS, enable_prefix_caching=True)
    a = make_request("a", list(range(9)))
    bm.allocate(a, 9)
    computed(bm, a, 9)
    cached = a.block_table[:2]
    bm.free(a)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 2

    b = make_request("b", list(range(8)) + [99, 98, 97, 96, 95, 94, 93, 92])
    blocks, num_tokens = bm.get_computed_blocks(b)
    assert blocks == cached and num_tokens == 8
    # 16 tokens need 4 blocks: the 2 cached ones are taken out of the free queue, so 2 more must be fresh.
    assert bm.can_allocate(b, 8, blocks)
    assert not bm.can_allocate(b, 13, blocks)  # 21 tokens = 6 blocks > 4
    assert bm.allocate(b, 8, blocks)
    assert bm.num_free_blocks == 0 and b.block_table[:2] == cached


def test_uncached_free_blocks_are_reused_before_cached_ones():
    bm = BlockManager(num_blocks=5, block_size=BS, enable_prefix_caching=True)
    a = make_request("a", list(range(10)))  # 2 full blocks + 1 partial
    bm.allocate(a, 10)
    computed(bm, a, 10)
    partial = a.block_table[2]
    bm.free(a)
    other = make_request("other", [60, 61])
    bm.allocate(other, 2)
    assert other.block_table == [partial]  # uncached blocks first; cached ones kept for hits
    assert bm.num_cached_blocks == 2


def test_lru_eviction_drops_the_tail_of_a_prefix_first():
    bm = BlockManager(num_blocks=4, block_size=BS, enable_prefix_caching=True)
    a = make_request("a", list(range(12)) + [40])  # 3 full blocks, all cached once computed
    bm.allocate(a, 12)
    computed(bm, a, 12)
    head, middle, tail = a.block_table
    bm.free(a)
    taker = make_request("taker", [70, 71, 72])
    bm.allocate(taker, 3)
    assert taker.block_table == [tail]  # the deepest block is evicted first
    blocks, num_tokens = bm.get_computed_blocks(make_request("again", list(range(12)) + [41]))
    assert blocks == [head, middle] and num_tokens == 8


def test_same_block_computed_twice_keeps_one_cached_copy():
    bm = BlockManager(num_blocks=16, block_size=BS, enable_prefix_caching=True)
    a = make_request("a", list(range(6)))
    b = make_request("b", list(range(6)))
    bm.allocate(a, 6)
    bm.allocate(b, 6)  # admitted in the same step: no hit yet
    computed(bm, a, 6)
    computed(bm, b, 6)
    assert bm.num_cached_blocks == 1
    c = make_request("c", list(range(6)))
    assert bm.get_computed_blocks(c)[0] == a.block_table[:1]
    kept = a.block_table[0]
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 15
    assert bm.get_computed_blocks(c) == ([kept], 4)


def test_reset_prefix_cache_forgets_unused_blocks():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=True)
    a = make_request("a", list(range(9)))
    bm.allocate(a, 9)
    computed(bm, a, 9)
    bm.free(a)
    bm.reset_prefix_cache()
    assert bm.num_cached_blocks == 0
    assert bm.get_computed_blocks(make_request("b", list(range(9)))) == ([], 0)


def test_bad_geometry():
    with pytest.raises(ValueError, match="num_blocks >= 2"):
        BlockManager(num_blocks=1, block_size=4)
