"""KVCacheManager operations end to end, from vLLM 0.33's test vectors (docs/semantics.md §3, §5-§8)
and the ``comp | new_comp | ext_comp | new | lookahead`` layout of ``allocate_slots`` (§3.1)."""

import pytest
from spec_helpers import admit, config

from kvspec.spec import kv_cache_manager as m
from kvspec.spec.config import ConfigError, KVCacheConfig, cross_attention, full_attention, sliding_window
from kvspec.spec.releases.line import FREE_ORDER_0_20
from kvspec.spec.releases.profile import BASE
from kvspec.spec.request import (
    RequestStatus,
    append_output_token_ids,
    make_request,
    with_num_computed_tokens,
    with_spec_token_ids,
    with_status,
)
from kvspec.spec.types import NULL_BLOCK_ID, GroupId


def ids(blocks):
    return [list(g) for g in blocks]


@pytest.mark.parametrize(
    "profile, after_free, req2_new, eviction_order",
    [
        (BASE, [5, 4, 6, 7, 8, 9, 10, 3, 2, 1], 5, [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]),
        (FREE_ORDER_0_20, [6, 7, 8, 9, 10, 4, 5, 3, 2, 1], 6, [7, 8, 9, 10, 4, 5, 6, 3, 2, 1]),
    ],
)
def test_prefill_vectors(profile, after_free, req2_new, eviction_order):
    """vLLM test_prefill: N=11, bs 16; the free order and the eviction order it implies."""
    cfg = config([full_attention(16)], 11, profile=profile)
    s = m.init_kv_cache_manager(cfg)
    common = list(range(48))
    r0 = make_request("0", common + [90, 91, 92, 93, 94, 95, 96], cfg)
    s, r0, hit, new = admit(s, r0)
    assert hit.num_hit_tokens == 0 and ids(new) == [[1, 2, 3, 4]]
    assert s.groups[0].num_cached_block["0"] == 3  # 3 full blocks hashed
    r1 = make_request("1", common + [80, 81, 82, 83, 84], cfg)
    s, r1, hit, new = admit(s, r1)
    assert ids(hit.blocks) == [[1, 2, 3]] and hit.num_hit_tokens == 48 and ids(new) == [[5]]
    assert [s.pool.ref_cnt[b] for b in (1, 2, 3)] == [2, 2, 2]
    s = m.free(s, "0")
    s = m.free(s, "1")
    assert list(s.pool.free_queue) == after_free
    r2 = make_request("2", common + [1, 2, 3], cfg)
    s, r2, hit, new = admit(s, r2)
    assert ids(hit.blocks) == [[1, 2, 3]] and ids(new) == [[req2_new]]
    s = m.free(s, "2")
    r3 = make_request("3", list(range(1000, 1000 + 16 * 10)), cfg)
    s, r3, hit, new = admit(s, r3, num_new_tokens=16 * 10)
    assert ids(new) == [eviction_order]


@pytest.mark.parametrize(
    "profile, after_free, req2_new",
    [(BASE, [6, 10, 5, 4, 3, 2, 1, 9, 8, 7], 6), (FREE_ORDER_0_20, [10, 6, 5, 4, 3, 2, 1, 9, 8, 7], 10)],
)
def test_evict_vectors(profile, after_free, req2_new):
    """vLLM test_evict: N=11, bs 16; a hit on blocks 1-2 then allocates from the head."""
    cfg = config([full_attention(16)], 11, profile=profile)
    s = m.init_kv_cache_manager(cfg)
    r0 = make_request("0", list(range(5 * 16 + 7)), cfg)
    s, r0, _, new = admit(s, r0)
    assert len(new[0]) == 6
    r1 = make_request("1", list(range(87, 87 + 3 * 16)), cfg)
    s, r1, _, new = admit(s, r1, num_new_tokens=48)
    assert len(new[0]) == 3 and len(s.pool.free_queue) == 1
    s = m.free(m.free(s, "0"), "1")
    assert list(s.pool.free_queue) == after_free
    r2 = make_request("2", list(range(2 * 16 + 3)), cfg)
    s, r2, hit, new = admit(s, r2)
    assert ids(hit.blocks) == [[1, 2]] and hit.num_hit_tokens == 32 and ids(new) == [[req2_new]]
    assert len(s.pool.free_queue) == 7


def test_block_aligned_prompt_recomputes_its_last_block():
    """The cap is num_tokens - 1: a 48-token prompt hits 2 blocks of 16, a 49-token one 3 (docs/semantics.md §10.1)."""
    cfg = config([full_attention(16)], 11)
    s = m.init_kv_cache_manager(cfg)
    s, _, _, _ = admit(s, make_request("a", list(range(49)), cfg))
    assert m.get_computed_blocks(s, make_request("b", list(range(48)), cfg)).num_hit_tokens == 32
    assert m.get_computed_blocks(s, make_request("c", list(range(49)), cfg)).num_hit_tokens == 48


def test_prompt_logprob_requests_never_read_but_still_write():
    """vLLM test_prefill_plp: skip_reading_prefix_cache disables the lookup, not the caching."""
    cfg = config([full_attention(16)], 11)
    s = m.init_kv_cache_manager(cfg)
    s, _, _, _ = admit(s, make_request("a", list(range(40)), cfg))
    plp = make_request("p", list(range(40)), cfg, skip_reading_prefix_cache=True)
    assert m.get_computed_blocks(s, plp).num_hit_tokens == 0
    s, _, _, new = admit(s, plp)
    assert s.groups[0].num_cached_block["p"] == 2 and len(new[0]) == 3


def test_hybrid_hit_uses_null_placeholders():
    """1 FA + 2 SWA groups (W = 2 blocks), 48-token common prefix: ([1,2,3],[0,6,7],[0,10,11])."""
    cfg = config([full_attention(16), sliding_window(16, 32), sliding_window(16, 32)], 31)
    s = m.init_kv_cache_manager(cfg)
    common = list(range(48))
    s, _, _, new = admit(s, make_request("0", common + [1, 2, 3, 4, 5, 6, 7], cfg))
    assert ids(new) == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    hit = m.get_computed_blocks(s, make_request("1", common + [9, 9, 9], cfg))
    assert ids(hit.blocks) == [[1, 2, 3], [0, 6, 7], [0, 10, 11]] and hit.num_hit_tokens == 48
    # Evicting the last block of one SWA group (both SWA groups must hit) leaves 2 blocks ...
    s2 = m.evict_blocks(s, [11])
    hit = m.get_computed_blocks(s2, make_request("1", common + [9], cfg))
    assert ids(hit.blocks) == [[1, 2], [5, 6], [9, 10]] and hit.num_hit_tokens == 32
    # ... and evicting FA block 0 kills every hit (hashes chain).
    s3 = m.evict_blocks(s, [1])
    assert m.get_computed_blocks(s3, make_request("1", common + [9], cfg)).num_hit_tokens == 0


def test_different_block_sizes_align_to_lcm():
    """vLLM test_different_block_size: FA bs 32 + SWA bs 16 (W 32), hash bs 16."""
    cfg = config([full_attention(32), sliding_window(16, 32)], 31)
    assert cfg.hash_block_size == 16 and cfg.scheduler_block_size == 32
    s = m.init_kv_cache_manager(cfg)
    prompt = list(range(112))
    s, _, _, new = admit(s, make_request("0", prompt, cfg))
    assert [len(g) for g in new] == [4, 7]
    swa = new[1]
    hit = m.get_computed_blocks(s, make_request("1", prompt + [7], cfg))
    assert [len(g) for g in hit.blocks] == [3, 6] and hit.num_hit_tokens == 96
    s = m.evict_blocks(s, [swa[5], swa[6]])
    hit = m.get_computed_blocks(s, make_request("1", prompt + [7], cfg))
    assert [len(g) for g in hit.blocks] == [2, 4] and hit.num_hit_tokens == 64


def test_evictable_hits_count_against_capacity_and_failure_changes_nothing():
    """vLLM test_prefill_not_enough_free_blocks_with_computed_blocks: 5 free, 3 of them the hits."""
    cfg = config([full_attention(16)], 11)
    s = m.init_kv_cache_manager(cfg)
    common = list(range(48))
    s, _, _, _ = admit(s, make_request("0", common + [1], cfg))
    s = m.free(s, "0")
    s, _, _, new = admit(s, make_request("filler", list(range(500, 580)), cfg))
    assert len(s.pool.free_queue) == 5 and all(s.pool.ref_cnt[b] == 0 for b in (1, 2, 3))
    big = make_request("big", common + list(range(900, 933)), cfg)  # 81 tokens: 3 hits + 3 new
    s_after, _, hit, new = admit(s, big)
    assert hit.num_hit_tokens == 48 and new is None and s_after == s
    ok = make_request("ok", common + list(range(900, 932)), cfg)  # 80 tokens: 3 hits + 2 new
    s, _, _, new = admit(s, ok)
    assert len(new[0]) == 2 and [s.pool.ref_cnt[b] for b in (1, 2, 3)] == [1, 1, 1]


def test_new_allocation_evicts_another_block_not_the_touched_hit():
    """vLLM test_computed_blocks_not_evicted: the hit is touched before new blocks are popped."""
    cfg = config([full_attention(16)], 3)
    s = m.init_kv_cache_manager(cfg)
    s, _, _, _ = admit(s, make_request("0", list(range(16)) + [1], cfg), num_new_tokens=16)
    s, _, _, _ = admit(s, make_request("1", list(range(100, 116)) + [1], cfg), num_new_tokens=16)
    s = m.free(m.free(s, "0"), "1")  # queue [1, 2], both hashed
    s, _, hit, new = admit(s, make_request("2", list(range(16)) + [5, 6], cfg))
    assert ids(hit.blocks) == [[1]] and ids(new) == [[2]]


def test_hash_of_reused_block_is_dropped_when_reallocated_partially():
    """vLLM test_hash_block_correct_reuse: a reused cached block comes back unhashed."""
    cfg = config([full_attention(16)], 2)
    s = m.init_kv_cache_manager(cfg)
    s, _, _, new = admit(s, make_request("0", list(range(16)), cfg), num_new_tokens=16)
    assert s.pool.block_key[1] is not None
    s = m.free(s, "0")
    s, _, _, new = admit(s, make_request("1", [7] * 7, cfg))
    assert ids(new) == [[1]] and s.pool.block_key[1] is None and not s.pool.cached


def test_decode_fills_partial_block_then_allocates_and_hashes():
    """vLLM test_decode: appends fill the partial block; a new block only when it is full."""
    cfg = config([full_attention(4)], 10)
    s = m.init_kv_cache_manager(cfg)
    s, r, _, new = admit(s, make_request("0", list(range(6)), cfg))
    assert ids(new) == [[1, 2]] and s.groups[0].num_cached_block["0"] == 1
    for tok, expect_new in ((6, []), (7, []), (8, [3])):
        r = append_output_token_ids(r, [tok])
        s, new = m.allocate_slots(s, r, 1)
        assert ids(new) == [expect_new]
        r = with_num_computed_tokens(r, r.num_tokens)
    assert s.groups[0].num_cached_block["0"] == 2  # the second block became full and hashed


def test_seed_diagram_comp_newcomp_extcomp_new_lookahead():
    """The ``allocate_slots`` layout (docs/semantics.md §3.1) with numbers, bs 4:
    | comp 0 | new_comp 8 (2 hit blocks) | ext_comp 12 (connector) | new 10 | lookahead 3 |
    need_slot = 33 -> 9 blocks; caching stops at num_tokens = 30 -> 7 full blocks."""
    cfg = config([full_attention(4)], 16, max_model_len=64)
    s = m.init_kv_cache_manager(cfg)
    prompt = list(range(30))
    s, _, _, _ = admit(s, make_request("warm", prompt[:8] + [99], cfg))
    s = m.free(s, "warm")
    req = make_request("r", prompt, cfg)
    hit = m.get_computed_blocks(s, req)
    assert hit.num_hit_tokens == 8
    free_before = len(s.pool.free_queue)
    s, new = m.allocate_slots(
        s,
        req,
        num_new_tokens=10,
        num_new_computed_tokens=8,
        new_computed_blocks=hit,
        num_lookahead_tokens=3,
        num_external_computed_tokens=12,
    )
    table = s.groups[0].req_to_blocks["r"]
    assert len(table) == 9  # cdiv(0 + 8 + 12 + 10 + 3, 4)
    assert table[:2] == hit.blocks[0]  # hits adopted first, in place
    assert len(new[0]) == 4 and table[5:] == new[0]  # only the new-token blocks are returned
    assert free_before - len(s.pool.free_queue) == 2 + 3 + 4  # 2 touched ref-0 hits + 3 ext + 4 new
    assert s.groups[0].num_cached_block["r"] == 7  # min(8 + 12 + 10, 30) // 4
    assert all(s.pool.block_key[b] is None for b in table[7:])  # partial and lookahead blocks


def test_seed_diagram_clamped_by_max_model_len():
    cfg = config([full_attention(4)], 16, max_model_len=32)
    s = m.init_kv_cache_manager(cfg)
    req = make_request("r", list(range(30)), cfg)
    s, new = m.allocate_slots(s, req, 18, num_lookahead_tokens=3, num_external_computed_tokens=12)
    assert len(s.groups[0].req_to_blocks["r"]) == 8  # min(33, 32) slots


def test_drafts_and_lookahead_are_never_cached():
    """Spec decode: the cache target is min(total + new, num_tokens); drafts are not tokens."""
    cfg = config([full_attention(4)], 16)
    s = m.init_kv_cache_manager(cfg)
    s, r, _, _ = admit(s, make_request("r", list(range(7)), cfg))  # 7 computed, 1 block cached
    r = append_output_token_ids(r, [7])  # 8 tokens, 2 hashes
    r = with_spec_token_ids(r, [50, 51, 52, 53])  # drafts
    s, new = m.allocate_slots(s, r, num_new_tokens=1 + 4, num_lookahead_tokens=4)
    assert len(s.groups[0].req_to_blocks["r"]) == 4  # cdiv(7 + 5 + 4, 4)
    assert s.groups[0].num_cached_block["r"] == 2  # only the 8 verified tokens


def test_delayed_caching_then_cache_blocks_on_arrival():
    """P/D: delay_cache_blocks allocates without publishing; cache_blocks publishes later."""
    cfg = config([full_attention(4)], 16)
    s = m.init_kv_cache_manager(cfg)
    req = make_request("r", list(range(17)), cfg)
    s, new = m.allocate_slots(s, req, 0, num_external_computed_tokens=16, delay_cache_blocks=True)
    assert len(s.groups[0].req_to_blocks["r"]) == 4 and ids(new) == [[]]  # ext blocks are not "new"
    assert not s.pool.cached and s.groups[0].num_cached_block["r"] == 0  # adopted (no hits) but nothing cached
    req = with_num_computed_tokens(req, 16)
    s = m.cache_blocks(s, req, 16)
    assert s.groups[0].num_cached_block["r"] == 4 and len(s.pool.cached) == 4


def test_sliding_window_frees_out_of_window_blocks_even_when_allocation_fails():
    """Step 5 (releasing out-of-window blocks) runs before the capacity check and survives a None
    (docs/semantics.md §3.1, §10.8)."""
    cfg = config([sliding_window(4, 4)], 5)
    s = m.init_kv_cache_manager(cfg)
    s, r, _, new = admit(s, make_request("r", list(range(16)), cfg), num_new_tokens=16)
    assert len(s.pool.free_queue) == 0
    r = append_output_token_ids(r, [1] * 9)
    # 25 tokens need 7 blocks; 16 - 4 + 1 = 13 tokens left the window, so 3 blocks are freed
    # first and exactly the 3 new blocks fit the 4-block pool.
    s, new = m.allocate_slots(s, r, 9)
    assert new is not None and len(new[0]) == 3
    assert s.groups[0].req_to_blocks["r"][:3] == (NULL_BLOCK_ID,) * 3
    s2 = m.init_kv_cache_manager(cfg)
    s2, r2, _, _ = admit(s2, make_request("r", list(range(16)), cfg), num_new_tokens=16)
    r2 = append_output_token_ids(r2, [1] * 30)
    s2, new = m.allocate_slots(s2, r2, 30)
    assert new is None
    assert s2.groups[0].req_to_blocks["r"][:3] == (NULL_BLOCK_ID,) * 3  # 16 - 4 + 1 = 13 skipped tokens


def test_watermark_holds_back_admission_only():
    cfg = config([full_attention(4)], 11, watermark=0.2)  # int(0.2 * 11) = 2 blocks
    s = m.init_kv_cache_manager(cfg)
    req = make_request("r", list(range(36)), cfg)  # 9 blocks of 10 free
    assert m.allocate_slots(s, req, 36)[1] is None
    assert m.allocate_slots(s, req, 36, has_scheduled_reqs=False)[1] is not None
    assert m.allocate_slots(s, with_status(req, RequestStatus.RUNNING), 36)[1] is not None


def test_reserved_blocks_and_full_sequence_gate():
    cfg = config([full_attention(4)], 11)
    s = m.init_kv_cache_manager(cfg)
    req = make_request("r", list(range(36)), cfg)
    assert m.allocate_slots(s, req, 8, reserved_blocks=9)[1] is None
    assert m.allocate_slots(s, req, 8, reserved_blocks=8)[1] is not None
    long = make_request("l", list(range(44)), cfg)  # 11 blocks > 10 free
    assert m.allocate_slots(s, long, 8, full_sequence_must_fit=True) == (s, None)
    assert m.allocate_slots(s, long, 8)[1] is not None


def test_cross_attention_sized_by_encoder_tokens():
    cfg = config([full_attention(4), cross_attention(4)], 20, enable_caching=False)
    s = m.init_kv_cache_manager(cfg)
    req = make_request("r", list(range(5)), cfg)
    s, new = m.allocate_slots(s, req, 5, num_encoder_tokens=9)
    assert [len(g) for g in new] == [2, 3]
    s, new = m.allocate_slots(s, with_num_computed_tokens(req, 5), 1)
    assert [len(g) for g in new] == [0, 0]  # 6 tokens fit the 2 decoder blocks; encoder blocks are not regrown


def test_caching_off_no_hashes_no_hits():
    cfg = config([full_attention(4)], 5, enable_caching=False)
    s = m.init_kv_cache_manager(cfg)
    req = make_request("r", list(range(9)), cfg)
    assert req.block_hashes == ()
    s, _, _, _ = admit(s, req)
    s = m.free(s, "r")
    assert m.get_computed_blocks(s, make_request("q", list(range(9)), cfg)).num_hit_tokens == 0
    assert (
        m.allocate_slots(s, make_request("big", list(range(17)), cfg), 17)[1] is None
    )  # vLLM test_basic_prefix_caching_disabled


def test_reset_refused_while_in_use():
    cfg = config([full_attention(4)], 5, enable_kv_cache_events=True)
    s = m.init_kv_cache_manager(cfg)
    s, _, _, _ = admit(s, make_request("r", list(range(9)), cfg))
    s, ok = m.reset_prefix_cache(s)
    assert not ok
    s, ok = m.reset_prefix_cache(m.free(s, "r"))
    assert ok and not s.pool.cached
    s, events = m.take_events(s)
    assert [type(e).__name__ for e in events] == ["BlockStored", "AllBlocksCleared"]
    assert m.take_events(s)[1] == ()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_new_tokens=-1), "num_new_tokens must be a non-negative int"),
        (dict(num_new_tokens=1, num_lookahead_tokens=-2), "num_lookahead_tokens"),
        (dict(num_new_tokens=0), "num_new_tokens must be greater than 0"),
        (dict(num_new_tokens=1, reserved_blocks=-1), "reserved_blocks"),
    ],
)
def test_bad_allocate_arguments_raise_clear_errors(kwargs, match):
    cfg = config([full_attention(4)], 5)
    s = m.init_kv_cache_manager(cfg)
    with pytest.raises(ValueError, match=match):
        m.allocate_slots(s, make_request("r", [1, 2], cfg), **kwargs)


@pytest.mark.parametrize(
    "groups, kw, match",
    [
        ([full_attention(0)], {}, "block_size must be an int >= 1"),
        ([sliding_window(4, 0)], {}, "sliding_window must be an int >= 1"),
        ([], {}, "at least one"),
        ([full_attention(4)], dict(num_blocks=0), "num_blocks"),
        ([full_attention(4)], dict(max_model_len=0), "max_model_len"),
        ([full_attention(4), cross_attention(4)], {}, "cross-attention groups require enable_caching=False"),
        (
            [full_attention(6), sliding_window(4, 8)],
            dict(hash_block_size_override=4),
            "not a multiple of hash_block_size",
        ),
        ([full_attention(4)], dict(watermark=1.5), "watermark"),
    ],
)
def test_impossible_configs_are_refused_by_name(groups, kw, match):
    args = dict(num_blocks=8, groups=tuple(groups), max_model_len=64)
    args.update(kw)
    with pytest.raises(ConfigError, match=match):
        m.init_kv_cache_manager(KVCacheConfig(**args))


def test_unknown_request_is_a_clear_error_where_vllm_would_misbehave():
    cfg = config([full_attention(4)], 5)
    s = m.init_kv_cache_manager(cfg)
    req = make_request("ghost", list(range(9)), cfg)
    with pytest.raises(ValueError, match="unknown request 'ghost'"):
        m.cache_blocks(s, req, 8)
    assert m.remove_skipped_blocks(s, "ghost", 8) == s  # full attention skips nothing
    assert m.free(s, "ghost") == s  # vLLM frees requests aborted before allocation: a no-op
    swa = m.init_kv_cache_manager(config([sliding_window(4, 4)], 5))
    assert m.remove_skipped_blocks(swa, "ghost", 8).groups[0].req_to_blocks == {"ghost": ()}
    with pytest.raises(ValueError, match="num_computed_tokens must be >= 0"):
        with_num_computed_tokens(req, -1)


def test_group_ids_are_part_of_the_key():
    """vLLM test_cache_blocks_multi_group: the same tokens in two groups give two keys."""
    cfg = config([full_attention(4), full_attention(4)], 20)
    s = m.init_kv_cache_manager(cfg)
    s, _, _, new = admit(s, make_request("r", list(range(9)), cfg))
    keys = {s.pool.block_key[b] for b in new[0][:2] + new[1][:2]}
    assert len(keys) == 4 and {k[-4:] for k in keys} == {(0).to_bytes(4, "big"), (1).to_bytes(4, "big")}
    assert GroupId(1) in {int.from_bytes(k[-4:], "big") for k in keys}


def test_features_separate_prefixes():
    """vLLM test_cache_key_salting / test_mm_prefix_caching: a different salt, LoRA or mm item
    gives a different chain, hence no hit; equal features hit."""
    from kvspec.spec.hashing import MMFeature

    cfg = config([full_attention(4)], 30)
    s = m.init_kv_cache_manager(cfg)
    prompt = list(range(13))
    s, _, _, _ = admit(
        s, make_request("base", prompt, cfg, cache_salt="s1", lora=("a", "/a"), mm_features=[MMFeature("img", 2, 3)])
    )
    same = make_request("same", prompt, cfg, cache_salt="s1", lora=("a", "/a"), mm_features=[MMFeature("img", 2, 3)])
    assert m.get_computed_blocks(s, same).num_hit_tokens == 12
    for other in (
        make_request("salt", prompt, cfg, cache_salt="s2", lora=("a", "/a"), mm_features=[MMFeature("img", 2, 3)]),
        make_request("lora", prompt, cfg, cache_salt="s1", lora=("b", "/a"), mm_features=[MMFeature("img", 2, 3)]),
        make_request("mm", prompt, cfg, cache_salt="s1", lora=("a", "/a"), mm_features=[MMFeature("pic", 2, 3)]),
    ):
        assert m.get_computed_blocks(s, other).num_hit_tokens == 0, other.request_id
    # an mm item in the third block only changes the chain from that block on
    late = make_request(
        "late",
        prompt,
        cfg,
        cache_salt="s1",
        lora=("a", "/a"),
        mm_features=[MMFeature("img", 2, 3), MMFeature("x", 9, 2)],
    )
    assert m.get_computed_blocks(s, late).num_hit_tokens == 8


def test_states_are_values():
    """No operation mutates the state (or request) it is given."""
    cfg = config([sliding_window(4, 8)], 12, enable_kv_cache_events=True)
    s0 = m.init_kv_cache_manager(cfg)
    s1, r, _, _ = admit(s0, make_request("r", list(range(13)), cfg))
    frozen = repr(s1)
    r2 = append_output_token_ids(r, [1] * 9)
    m.allocate_slots(s1, r2, 9)
    m.free(s1, "r")
    m.evict_blocks(s1, [1, 2])
    m.reset_prefix_cache(s1)
    m.take_events(s1)
    m.cache_blocks(s1, r, 12)
    m.remove_skipped_blocks(s1, "r", 20)
    assert repr(s1) == frozen


def test_partial_tail_entry_for_wide_full_attention_blocks():
    """vLLM 0.33 FullAttentionManager._cache_partial_tail_block: with FA bs 4 over hash bs 2, the
    prompt's last hash boundary (6 of a 7-token prompt) is published as an extra key of the FA
    block holding it, with a one-hash-block event; evicting the block removes both keys."""
    from kvspec.spec.events import BlockRemoved, BlockStored

    cfg = config([full_attention(4), sliding_window(2, 4)], 13, enable_kv_cache_events=True)
    s = m.init_kv_cache_manager(cfg)
    s, r, _, new = admit(s, make_request("r0", list(range(7)), cfg))
    fa_block = new[0][1]
    s, _ = m.take_events(s)
    r = append_output_token_ids(r, [100])
    s, _ = m.allocate_slots(s, r, 1)
    s, events = m.take_events(s)
    hashes = r.block_hashes
    partial = [e for e in events if isinstance(e, BlockStored) and e.group_id == 0 and e.block_size == 2]
    assert partial == [BlockStored((hashes[2],), hashes[1], (4, 5), 2, GroupId(0))]
    assert s.pool.secondary_keys[fa_block] == (hashes[2] + (0).to_bytes(4, "big"),)
    s = m.evict_blocks(s, [fa_block])
    s, events = m.take_events(s)
    assert events == (BlockRemoved((hashes[3],), GroupId(0)), BlockRemoved((hashes[2],), GroupId(0)))
