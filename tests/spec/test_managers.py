"""Single-type manager rules: vLLM 0.33's window/chunk vectors (docs/semantics.md §5, vLLM's
test_single_type_kv_cache_manager.py)."""

import pytest
from spec_helpers import config

from kvspec.spec import managers
from kvspec.spec.block_pool import get_new_blocks
from kvspec.spec.config import chunked_local, full_attention, sliding_window
from kvspec.spec.state import init_state, with_num_cached_block, with_pool, with_table
from kvspec.spec.types import NULL_BLOCK_ID, BlockId, GroupId, RequestId

R = RequestId("r")
G0 = GroupId(0)


def pattern_lookup(pattern):
    """A lookup over a pattern of cached (True) / missing (False) blocks; block i is id 100+i."""
    return lambda i: (BlockId(100 + i),) if i < len(pattern) and pattern[i] else None


@pytest.mark.parametrize(
    "pattern, expect_blocks",
    [
        ([False] * 10, 0),
        ([True], 1),
        ([True, False], 1),
        ([True, True], 2),
        ([True, True, True, False], 3),
        ([True, True, False, True, False, False, True, True, False, False, False], 8),
        ([True, True, False, True, False, False, True, True, False, True, True, True], 12),
    ],
)
def test_sliding_window_hit_vectors(pattern, expect_blocks):
    """bs 2, W 4 => two contiguous blocks make a hit (vLLM test_sliding_window_possible_cached_prefix)."""
    blocks, hit = managers.find_longest_cache_hit_sliding_window(pattern_lookup(pattern), 1, len(pattern) * 2, 2, 2, 4)
    assert hit == expect_blocks * 2
    assert len(blocks[0]) == expect_blocks
    # Positions before the qualifying run are nulls; the run itself is real.
    for i, b in enumerate(blocks[0]):
        assert b == NULL_BLOCK_ID or b == 100 + i


def test_sliding_window_docstring_example_nulls_before_the_window():
    """bs 4, W 8, four cached blocks: [NULL, NULL, b2, b3] (vLLM's find_longest_cache_hit docstring shape)."""
    blocks, hit = managers.find_longest_cache_hit_sliding_window(pattern_lookup([True] * 4), 1, 16, 4, 4, 8)
    assert blocks[0] == (0, 0, 102, 103) and hit == 16


@pytest.mark.parametrize(
    "pattern, tail, expect_blocks",
    [
        ([True], 0, 1),
        ([True, False], 0, 2),
        ([True, True, False], 1, 2),
        ([True, True, True], 1, 3),
        ([True, True, True, False], 0, 4),
        ([False] * 8 + [True], 1, 9),
        ([False] * 8 + [False], 1, 8),
    ],
)
def test_chunked_local_hit_vectors(pattern, tail, expect_blocks):
    """bs 2, C 4: blocks before the current chunk count as hit nulls
    (vLLM test_chunked_local_attention_possible_cached_prefix)."""
    max_length = len(pattern) * 2 + tail
    blocks, hit = managers.find_longest_cache_hit_chunked_local(pattern_lookup(pattern), 1, max_length, 2, 2, 4)
    assert hit == expect_blocks * 2 and len(blocks[0]) == expect_blocks


def test_chunked_local_hit_can_be_all_nulls():
    """C 8, bs 4, max_length 16: four nulls, a 16-token hit, nothing touched (docs/semantics.md §5)."""
    blocks, hit = managers.find_longest_cache_hit_chunked_local(pattern_lookup([]), 1, 16, 4, 4, 8)
    assert blocks[0] == (0, 0, 0, 0) and hit == 16


def test_full_attention_hit_stops_at_first_miss_and_aligns():
    blocks, hit = managers.find_longest_cache_hit_full(pattern_lookup([True, True, False, True]), 1, 8 * 16, 16, 16)
    assert blocks[0] == (100, 101) and hit == 32
    # Hybrid alignment 32 with bs 16: 3 hits round down to 2 blocks.
    blocks, hit = managers.find_longest_cache_hit_full(pattern_lookup([True] * 3), 1, 64, 16, 32)
    assert blocks[0] == (100, 101) and hit == 32


def _table_of(spec, n_blocks):
    state = init_state(config([spec], n_blocks + 1))
    pool, got = get_new_blocks(state.pool, n_blocks)
    return with_table(with_pool(state, pool), G0, R, got), got


@pytest.mark.parametrize("n, nulled", [(0, 0), (4, 0), (5, 1), (6, 1), (7, 2), (11, 4)])
def test_sliding_window_remove_skipped_vectors(n, nulled):
    """bs 2, W 4, 11 real blocks (vLLM test_sliding_window_remove_skipped_blocks)."""
    state, got = _table_of(sliding_window(2, 4), 11)
    state = managers.remove_skipped_blocks(state, G0, R, n)
    table = state.groups[0].req_to_blocks[R]
    assert table[:nulled] == (0,) * nulled and table[nulled:] == got[nulled:]


def test_sliding_window_remove_skipped_frees_descending_and_stops_at_null():
    state, got = _table_of(sliding_window(2, 4), 11)
    state = managers.remove_skipped_blocks(state, G0, R, 7)  # nulls 0, 1
    queue_before = state.pool.free_queue
    state = managers.remove_skipped_blocks(state, G0, R, 11)  # nulls 2, 3; freed [b3, b2]
    assert state.pool.free_queue == (got[3], got[2]) + queue_before


@pytest.mark.parametrize("n, nulled", [(0, 0), (4, 2), (6, 2), (12, 6)])
def test_chunked_local_remove_skipped_vectors(n, nulled):
    """bs 2, C 4, 11 blocks (vLLM test_chunked_local_attention_remove_skipped_blocks)."""
    state, _ = _table_of(chunked_local(2, 4), 11)
    state = managers.remove_skipped_blocks(state, G0, R, n)
    table = state.groups[0].req_to_blocks[R]
    assert table[:nulled] == (0,) * nulled and 0 not in table[nulled:]


def test_remove_skipped_on_unknown_request_creates_empty_table():
    """vLLM indexes its defaultdict, so an unknown request gets an (empty) table entry."""
    state = init_state(config([sliding_window(2, 4)], 4))
    state = managers.remove_skipped_blocks(state, G0, R, 10)
    assert state.groups[0].req_to_blocks == {R: ()}


@pytest.mark.parametrize("spec", [sliding_window(2, 4), chunked_local(2, 4)])
def test_predictor_counts_evictable_hits(spec):
    """vLLM test_get_num_blocks_to_allocate: 20 blocks needed; 10 ref-0 hits -> 20; 5 nulls + 5 ref-0 hits -> 15."""
    state = init_state(config([spec], 101))
    hits = tuple(BlockId(i) for i in range(1, 11))  # free (ref 0) blocks
    assert managers.get_num_blocks_to_allocate(state, G0, R, 40, hits, 0) == 20
    hits = (NULL_BLOCK_ID,) * 5 + tuple(BlockId(i) for i in range(1, 6))
    assert managers.get_num_blocks_to_allocate(state, G0, R, 40, hits, 0) == 15


def test_predictor_running_fast_path_never_negative():
    """Rejected drafts can leave a table longer than needed: max(required - held, 0)."""
    state, _ = _table_of(full_attention(4), 5)
    state = with_num_cached_block(state, G0, R, 0)
    assert managers.get_num_blocks_to_allocate(state, G0, R, 8, (), 8) == 0


def test_reachable_mask_caches_only_window_tail_of_each_segment():
    """Hybrid FA bs 32 + SWA bs 8, W 8: only SWA blocks #3 and #7 of a 64-token prompt (docs/semantics.md §5)."""
    mask = managers.get_reachable_block_mask(sliding_window(8, 8), 0, 8, 32)
    assert [i for i, m in enumerate(mask) if m] == [3, 7]
    assert managers.get_reachable_block_mask(sliding_window(16, 32), 0, 4, 16) is None
