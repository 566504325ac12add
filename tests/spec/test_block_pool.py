"""BlockPool operations, checked against the rules and vectors of docs/semantics.md §3.3."""

import pytest

from kvspec.spec import block_pool as bp
from kvspec.spec.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvspec.spec.releases.line import FREE_ORDER_0_20
from kvspec.spec.types import BlockHash, BlockId, GroupId, make_block_key

H = [BlockHash(bytes([i]) * 32) for i in range(8)]


def test_init_pops_block_zero_as_null():
    pool = bp.init_block_pool(5, enable_caching=True)
    assert pool.free_queue == (1, 2, 3, 4)
    assert bp.get_num_free_blocks(pool) == 4
    assert bp.get_usage(pool) == 0.0


def test_get_new_blocks_takes_from_the_front_and_refuses_too_many():
    pool = bp.init_block_pool(5, enable_caching=True)
    pool, got = bp.get_new_blocks(pool, 3)
    assert got == (1, 2, 3)
    assert pool.ref_cnt[1:4] == (1, 1, 1)
    assert pool.free_queue == (4,)
    assert bp.get_usage(pool) == 0.75
    with pytest.raises(ValueError, match="Cannot get 2 free blocks"):
        bp.get_new_blocks(pool, 2)


def test_free_blocks_033_prepends_unhashed_and_appends_hashed():
    pool = bp.init_block_pool(6, enable_caching=True)
    pool, got = bp.get_new_blocks(pool, 4)  # 1..4, queue [5]
    pool = bp.cache_full_blocks(pool, [0] * 8, H, got, 0, 2, 4, GroupId(0))  # hash blocks 1, 2
    pool = bp.free_blocks(pool, [4, 3, 2, 1])  # tail first, as free() passes it
    assert pool.free_queue == (4, 3, 5, 2, 1)


def test_free_blocks_020_appends_everything():
    pool = bp.init_block_pool(6, enable_caching=True, profile=FREE_ORDER_0_20)
    pool, got = bp.get_new_blocks(pool, 4)
    pool = bp.cache_full_blocks(pool, [0] * 8, H, got, 0, 2, 4, GroupId(0))
    pool = bp.free_blocks(pool, [4, 3, 2, 1])
    assert pool.free_queue == (5, 4, 3, 2, 1)


def test_free_blocks_with_caching_off_prepends_all():
    pool = bp.init_block_pool(4, enable_caching=False)
    pool, got = bp.get_new_blocks(pool, 2)
    pool = bp.free_blocks(pool, [2, 1])
    assert pool.free_queue == (2, 1, 3)


def test_shared_block_rejoins_queue_only_at_zero():
    pool = bp.init_block_pool(4, enable_caching=True)
    pool, (b,) = bp.get_new_blocks(pool, 1)
    pool = bp.touch(pool, [b])
    pool = bp.free_blocks(pool, [b])
    assert b not in pool.free_queue and pool.ref_cnt[b] == 1
    pool = bp.free_blocks(pool, [b])
    assert pool.free_queue[0] == b


def test_touch_pulls_a_free_cached_block_out_of_the_middle_and_skips_null():
    pool = bp.init_block_pool(5, enable_caching=True)
    pool = bp.touch(pool, [BlockId(0), BlockId(3)])
    assert pool.free_queue == (1, 2, 4)
    assert pool.ref_cnt[3] == 1 and pool.ref_cnt[0] == 0


def test_lazy_eviction_keeps_hash_until_reuse():
    pool = bp.init_block_pool(3, enable_caching=True, enable_kv_cache_events=True)
    pool, got = bp.get_new_blocks(pool, 2)
    pool = bp.cache_full_blocks(pool, list(range(4)), H, got, 0, 1, 2, GroupId(0))
    pool = bp.free_blocks(pool, [2, 1])
    key = make_block_key(H[0], GroupId(0))
    assert bp.get_cached_block(pool, H[0], [GroupId(0)]) == (1,)  # freed but still hittable
    pool, _ = bp.take_events(pool)
    pool, got = bp.get_new_blocks(pool, 2)  # 2 (unhashed, at the front) then 1 (hashed)
    assert got == (2, 1)
    assert key not in pool.cached and pool.block_key[1] is None
    assert pool.events == (BlockRemoved((H[0],), GroupId(0)),)


def test_duplicates_under_one_key_first_inserted_wins_and_eviction_keeps_the_other():
    """vLLM test_maybe_evict_cached_block / test_block_lookup_cache_multi_blocks_per_key."""
    pool = bp.init_block_pool(4, enable_caching=True)
    pool, got = bp.get_new_blocks(pool, 2)
    pool = bp.cache_full_blocks(pool, [0] * 2, H, got[:1], 0, 1, 2, GroupId(0))
    pool = bp.cache_full_blocks(pool, [0] * 2, H, got[1:], 0, 1, 2, GroupId(0))
    key = make_block_key(H[0], GroupId(0))
    assert pool.cached[key] == (1, 2)
    assert bp.get_cached_block(pool, H[0], [GroupId(0)]) == (1,)
    pool = bp.evict_blocks(pool, [1])
    assert pool.cached[key] == (2,)
    assert pool.block_key[1] is None and pool.ref_cnt[1] == 1  # evict does not free


def test_cache_full_blocks_event_covers_range_and_skips_nulls():
    pool = bp.init_block_pool(4, enable_caching=True, enable_kv_cache_events=True)
    pool, got = bp.get_new_blocks(pool, 2)
    table = (BlockId(0),) + got  # a sliding-window table with a null first slot
    pool = bp.cache_full_blocks(pool, list(range(6)), H, table, 0, 3, 2, GroupId(1))
    (ev,) = pool.events
    assert ev == BlockStored((H[1], H[2]), None, tuple(range(6)), 2, GroupId(1))
    assert pool.block_key[0] is None


def test_cache_full_blocks_parent_is_previous_hash():
    pool = bp.init_block_pool(4, enable_caching=True, enable_kv_cache_events=True)
    pool, got = bp.get_new_blocks(pool, 2)
    pool = bp.cache_full_blocks(pool, list(range(4)), H, got, 0, 1, 2, GroupId(0))
    pool = bp.cache_full_blocks(pool, list(range(4)), H, got, 1, 2, 2, GroupId(0))
    assert pool.events[1].parent_block_hash == H[0] and pool.events[1].token_ids == (2, 3)


def test_reset_refused_while_in_use_and_keeps_order_when_it_succeeds():
    pool = bp.init_block_pool(4, enable_caching=True, enable_kv_cache_events=True)
    pool, got = bp.get_new_blocks(pool, 2)
    pool = bp.cache_full_blocks(pool, [0] * 4, H, got, 0, 2, 2, GroupId(0))
    refused, ok = bp.reset_prefix_cache(pool)
    assert not ok and refused == pool
    pool = bp.free_blocks(pool, [2, 1])
    order = pool.free_queue
    pool, ok = bp.reset_prefix_cache(pool)
    assert ok and not pool.cached and all(k is None for k in pool.block_key)
    assert pool.free_queue == order and pool.events[-1] == AllBlocksCleared()


def test_events_disabled_means_none_queued():
    pool = bp.init_block_pool(3, enable_caching=True)
    pool, got = bp.get_new_blocks(pool, 1)
    pool = bp.cache_full_blocks(pool, [0] * 2, H, got, 0, 1, 2, GroupId(0))
    assert bp.take_events(pool)[1] == ()


def test_operations_never_mutate_their_input():
    pool = bp.init_block_pool(5, enable_caching=True, enable_kv_cache_events=True)
    snapshot = repr(pool)
    bp.get_new_blocks(pool, 2)
    bp.touch(pool, [1])
    bp.reset_prefix_cache(pool)
    assert repr(pool) == snapshot
