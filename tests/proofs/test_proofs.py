"""Every claim proves on the spec, and each fails on a deliberately mutated formula (teeth)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import z3

from kvspec.harness.proofs import COUNTEREXAMPLE, PROVEN, REFUTED, all_claims, run_claim, windows
from kvspec.harness.proofs import coverage_failures as cov
from kvspec.harness.proofs import keys as key_claims
from kvspec.harness.proofs import pool as pool_claims
from kvspec.spec import arith, block_pool, coordinator, hashing, types
from kvspec.spec.types import NULL_BLOCK_ID

pytestmark = pytest.mark.proof

CLAIMS = {c.name: c for c in all_claims()}


SLOW_CLAIMS = {"hit_search.hybrid_end_to_end"}  # 6-8 s: the full tier


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.full) if n in SLOW_CLAIMS else n for n in CLAIMS])
def test_claim_is_proven(name: str) -> None:
    result = run_claim(CLAIMS[name], timeout_s=60)
    assert result.outcome.status == PROVEN, result.outcome


# --- mutants: (claim, description, module, attribute, replacement) -----------------------------


def _slot_targets_clamp_off_by_one(c: int, nc: int, e: int, n: int, la: int, M: int) -> arith.SlotTargets:
    local = c + nc
    unclamped = local + e
    total = arith.minimum(unclamped, M)
    main = total + n
    return arith.SlotTargets(local, unclamped, total, main, arith.minimum(main + la, M + 1))


def _hybrid_single_pass(spec_groups: Any, num_groups: int, cap: int, search: Any) -> Any:
    """vLLM 0.11-style: each group searched once, in order, without re-checking earlier groups."""
    current = cap
    hits: list[Any] = [()] * num_groups
    for sg in spec_groups:
        found, current = search(sg, current)
        for gid, blocks in zip(sg.group_ids, found):
            hits[gid] = blocks
    return tuple(hits), current, 0


def _free_blocks_rejoin_at_one(pool: Any, ordered_blocks: Any) -> Any:
    """free_blocks that puts a block back in the queue when its count reaches 1, not 0."""
    ref = list(pool.ref_cnt)
    back = []
    for b in ordered_blocks:
        if b == NULL_BLOCK_ID:
            continue
        ref[b] -= 1
        if ref[b] <= 1 and b not in pool.free_queue and b not in back:
            back.append(b)
    from dataclasses import replace

    return replace(pool, ref_cnt=tuple(ref), free_queue=pool.free_queue + tuple(back))


def _get_new_blocks_keeps_hash(pool: Any, num_blocks: int) -> Any:
    """get_new_blocks that forgets to evict the popped blocks' hashes."""
    from dataclasses import replace

    taken = pool.free_queue[:num_blocks]
    ref = list(pool.ref_cnt)
    for b in taken:
        ref[b] = 1
    return replace(pool, ref_cnt=tuple(ref), free_queue=pool.free_queue[num_blocks:]), taken


def _enc_free_rejoin_at_one(s: Any, b: Any) -> Any:
    joins = s.ref[b] - 1 <= 1
    t = pool_claims._with(s, b, ref=s.ref[b] - 1, inq=joins, refs=s.refs[b] - 1, dfree=z3.If(joins, 1, 0))
    return z3.And(b >= 1, b < s.N, s.refs[b] >= 1), t


def _enc_touch_stays_queued(s: Any, b: Any) -> Any:
    t = pool_claims._with(s, b, ref=s.ref[b] + 1, refs=s.refs[b] + 1)
    return z3.And(b >= 1, b < s.N), t


Mutant = tuple[str, str, Any, str, Callable[..., Any]]

MUTANTS: list[Mutant] = [
    (
        "allocate_slots.slot_targets",
        "need_slot clamped to max_model_len + 1",
        arith,
        "compute_slot_targets",
        _slot_targets_clamp_off_by_one,
    ),
    (
        "allocate_slots.table_length",
        "new blocks as n // bs + 1 instead of cdiv",
        arith,
        "get_num_new_blocks_to_allocate",
        lambda n, bs, held: arith.maximum(0, arith.floordiv(n, bs) + 1 - held),
    ),
    (
        "allocate_slots.predictor_matches_allocator",
        "predictor's required blocks as n // bs + 1",
        arith,
        "get_num_required_blocks",
        lambda n, bs: arith.floordiv(n, bs) + 1,
    ),
    (
        "allocate_slots.predictor_matches_allocator",
        "predictor ignores the skipped blocks (0.11 rule)",
        arith,
        "get_num_new_blocks_admission",
        lambda req, skipped, local, ev: arith.maximum(req - local, 0) + ev,
    ),
    (
        "allocate_slots.cache_bounds",
        "cache cap at num_tokens + 1",
        arith,
        "get_num_tokens_to_cache",
        lambda total, new, T: arith.minimum(total + new, T + 1),
    ),
    (
        "allocate_slots.cache_bounds",
        "cache one token past total + new",
        arith,
        "get_num_tokens_to_cache",
        lambda total, new, T: arith.minimum(total + new + 1, T),
    ),
    (
        "get_computed_blocks.hit_cap",
        "hit cap num_tokens instead of num_tokens - 1",
        arith,
        "get_max_cache_hit_length",
        lambda T: T,
    ),
    (
        "sliding_window.remove_skipped",
        "skip n - W + 2 tokens (frees an attended block)",
        arith,
        "get_sliding_window_num_skipped_tokens",
        lambda n, W: arith.maximum(0, n - W + 2),
    ),
    (
        "sliding_window.remove_skipped",
        "skip n - W tokens (leaks a block)",
        arith,
        "get_sliding_window_num_skipped_tokens",
        lambda n, W: arith.maximum(0, n - W),
    ),
    (
        "sliding_window.remove_skipped",
        "skipped blocks by ceiling",
        arith,
        "get_num_skipped_blocks",
        lambda s, bs: arith.cdiv(s, bs),
    ),
    (
        "sliding_window.hit_rule",
        "cdiv(W, bs) blocks (not the least)",
        arith,
        "get_sliding_window_blocks_for_hit",
        lambda W, bs: arith.cdiv(W, bs),
    ),
    (
        "sliding_window.hit_rule",
        "(W - 1) // bs blocks (does not cover)",
        arith,
        "get_sliding_window_blocks_for_hit",
        lambda W, bs: arith.floordiv(W - 1, bs),
    ),
    (
        "chunked_local.remove_skipped",
        "chunk of n + 1 (frees the current chunk at its last token)",
        arith,
        "get_chunked_local_num_skipped_tokens",
        lambda n, C: arith.align_down(n + 1, C),
    ),
    (
        "chunked_local.remove_skipped",
        "chunk of n - 1 (keeps the old chunk at exact multiples)",
        arith,
        "get_chunked_local_num_skipped_tokens",
        lambda n, C: arith.maximum(0, arith.align_down(n - 1, C)),
    ),
    (
        "chunked_local.hit_start",
        "chunk of max_length + 1",
        arith,
        "get_chunked_local_hit_start",
        lambda ml, C: arith.align_down(ml + 1, C),
    ),
    (
        "window_coverage.holds",
        "sliding-window skip n - W + 2 (nulls the block of the window's first token)",
        arith,
        "get_sliding_window_num_skipped_tokens",
        lambda n, W: arith.maximum(0, n - W + 2),
    ),
    (
        "window_coverage.holds",
        "chunked-local skip of n + 1's chunk",
        arith,
        "get_chunked_local_num_skipped_tokens",
        lambda n, C: arith.align_down(n + 1, C),
    ),
    (
        "window_coverage.holds",
        "sliding-window hit ends with one block fewer than cdiv(W - 1, bs)",
        arith,
        "get_sliding_window_blocks_for_hit",
        lambda W, bs: arith.maximum(0, arith.cdiv(W - 1, bs) - 1),
    ),
    (
        "window_coverage.full_remote_load",
        "condition off by one: (T - W) % B == 0",
        cov,
        "full_load_condition",
        lambda kind, T, a, b: (
            cov._and(T - a >= b, (T - a) % b == 0)
            if kind == "sliding_window"
            else cov._and(T % a == 0, T >= a, T % b < a)
            if kind == "chunked_local"
            else False
        ),
    ),
    (
        "window_coverage.full_remote_load",
        "sliding-window skip n - W (keeps one token more: no violation left)",
        arith,
        "get_sliding_window_num_skipped_tokens",
        lambda n, W: arith.maximum(0, n - W),
    ),
    (
        "window_coverage.invalid_block_recovery",
        "condition off by one: (i - z) * B <= W - 1",
        cov,
        "invalid_block_condition",
        lambda kind, T0, i, a, b: (
            cov._and(T0 - a + 1 >= b, (i - cov._fdiv(T0 - a + 1, b)) * b <= a - 1)
            if kind == "sliding_window"
            else False
        ),
    ),
    (
        "window_coverage.invalid_block_recovery",
        "sliding-window skip n - W + 2",
        arith,
        "get_sliding_window_num_skipped_tokens",
        lambda n, W: arith.maximum(0, n - W + 2),
    ),
    (
        "window_coverage.chunk_not_block_multiple",
        "condition off by one: h + e <= ceil(h / C) * C",
        cov,
        "chunk_condition",
        lambda h, e, r, C: cov._and(r == 0, h + e <= cov._fdiv(h + C - 1, C) * C),
    ),
    (
        "window_coverage.chunk_not_block_multiple",
        "chunked hit start of max_length + 1",
        arith,
        "get_chunked_local_hit_start",
        lambda ml, C: arith.align_down(ml + 1, C),
    ),
    (
        "hit_search.per_group",
        "sliding window needs (W - 1) // bs blocks",
        arith,
        "get_sliding_window_blocks_for_hit",
        lambda W, bs: arith.floordiv(W - 1, bs),
    ),
    ("hit_search.per_group", "full-attention hit not rounded to the alignment", arith, "align_down", lambda n, a: n),
    (
        "hit_search.hybrid_fixed_point",
        "a single pass instead of a fixed point",
        coordinator,
        "find_longest_cache_hit_hybrid",
        _hybrid_single_pass,
    ),
    (
        "hit_search.hybrid_end_to_end",
        "a single pass instead of a fixed point",
        coordinator,
        "find_longest_cache_hit_hybrid",
        _hybrid_single_pass,
    ),
    (
        "hit_search.hybrid_end_to_end",
        "sliding window needs one block fewer",
        arith,
        "get_sliding_window_blocks_for_hit",
        lambda W, bs: arith.maximum(0, arith.cdiv(W - 1, bs) - 1),
    ),
    (
        "pool.invariants_inductive",
        "a freed block rejoins the queue at ref_cnt 1",
        pool_claims,
        "enc_free",
        _enc_free_rejoin_at_one,
    ),
    (
        "pool.invariants_inductive",
        "touch leaves a ref-0 block in the queue",
        pool_claims,
        "enc_touch",
        _enc_touch_stays_queued,
    ),
    (
        "pool.invariants_bounded",
        "free_blocks requeues at ref_cnt 1",
        block_pool,
        "free_blocks",
        _free_blocks_rejoin_at_one,
    ),
    (
        "pool.invariants_bounded",
        "get_new_blocks keeps the popped blocks' hashes",
        block_pool,
        "get_new_blocks",
        _get_new_blocks_keeps_hash,
    ),
    (
        "keys.hash_input_injective",
        "untagged LoRA name and salt (vLLM <= 0.20 form)",
        hashing,
        "_gen_cache_salt_extra_keys",
        lambda f, start, profile: [f.cache_salt] if start == 0 and f.cache_salt else [],
    ),
    (
        "keys.hash_input_injective",
        "multimodal key without its offset (vLLM 0.11 form)",
        hashing,
        "_gen_mm_extra_keys",
        lambda f, start, end, profile, resumed: [
            ("mm", m.identifier) for m in f.mm_features if m.offset < end and m.offset + m.length > start
        ],
    ),
    (
        "keys.hash_input_injective",
        "LoRA key without the adapter path",
        hashing,
        "_gen_lora_extra_keys",
        lambda f, profile: [] if f.lora is None else [("lora", f.lora[0])],
    ),
    ("keys.block_key_injective", "group id left out of the key", types, "make_block_key", lambda h, g: h),
    (
        "keys.polynomial_key_collides",
        "an injective key (base 2**17, 272 bits) has no collision",
        key_claims,
        "polynomial_rolling_key",
        lambda ts: key_claims_exact(ts),
    ),
    (
        "keys.truncated_token_key_collides",
        "keeping all 17 bits of each token has no collision",
        key_claims,
        "truncated_token_key",
        lambda ts: z3.Concat(*[z3.Extract(16, 0, t) for t in ts]) if not isinstance(ts[0], int) else tuple(ts),
    ),
]


def key_claims_exact(ts: list[Any]) -> Any:
    key: Any = 0
    for t in ts:
        key = key * (1 << key_claims.VOCAB_BITS) + t
    return key


def _untagged_lora(f: Any, profile: Any) -> list[Any]:
    return [] if f.lora is None else [f.lora[0]]


@pytest.mark.parametrize(
    "claim, description, module, attr, replacement", MUTANTS, ids=[f"{m[0]}: {m[1]}" for m in MUTANTS]
)
def test_mutant_is_caught(
    monkeypatch: pytest.MonkeyPatch,
    claim: str,
    description: str,
    module: Any,
    attr: str,
    replacement: Callable[..., Any],
) -> None:
    monkeypatch.setattr(module, attr, replacement)
    if description.startswith("untagged LoRA"):
        monkeypatch.setattr(hashing, "_gen_lora_extra_keys", _untagged_lora)
    outcome = run_claim(CLAIMS[claim], timeout_s=60).outcome
    assert outcome.status in (COUNTEREXAMPLE, REFUTED), outcome


def test_every_claim_has_a_mutant() -> None:
    assert set(CLAIMS) == {m[0] for m in MUTANTS}


def test_chunked_hit_needs_chunk_multiple_of_block_size() -> None:
    """Dropping the premise C % bs == 0 gives a concrete unsound hit: Z3 finds one."""
    outcome = windows.check_chunked_local_hit_start_any_chunk(30)
    assert outcome.status == COUNTEREXAMPLE
    m = outcome.model
    assert m["C"] % m["bs"] != 0


def test_weak_key_witnesses_replay_on_ints() -> None:
    for name, fn in (
        ("keys.polynomial_key_collides", key_claims.polynomial_rolling_key),
        ("keys.truncated_token_key_collides", key_claims.truncated_token_key),
    ):
        outcome = run_claim(CLAIMS[name], timeout_s=60).outcome
        a, b = outcome.model["tokens_a"], outcome.model["tokens_b"]
        assert a != b and fn(a) == fn(b)
        assert all(0 <= t < 1 << key_claims.VOCAB_BITS for t in a + b)


def test_derived_conditions_match_the_spec_on_ints() -> None:
    """The proven conditions agree with the spec's composition evaluated on small ints (no local hit)."""
    for T in range(1, 41):
        for a in range(1, 11):
            for b in range(1, 7):
                for kind in ("sliding_window", "chunked_local"):
                    assert cov.full_load_violation(kind, T, a, b) == cov.full_load_condition(kind, T, a, b)
                    for i in cov.loaded_blocks(kind, T, a, b):
                        if kind == "sliding_window" or a % b == 0:
                            assert cov.invalid_block_violation(kind, T, i, a, b) == cov.invalid_block_condition(
                                kind, T, i, a, b
                            )
                hz = (T - 1) // a * a // b
                assert cov.chunk_violation(T, a, b) == cov.chunk_condition(hz * b, 0, 0, a)


def test_full_remote_load_reports_the_realistic_sizes() -> None:
    outcome = run_claim(CLAIMS["window_coverage.full_remote_load"], timeout_s=60).outcome
    assert outcome.status == PROVEN
    assert outcome.model["sliding_window_W4096_B16"]["first"] == [4111, 4127, 4143]
    assert outcome.model["sliding_window_W128_B16"]["first"][0] == 143
    assert outcome.model["chunked_local_C8192_B16"] == {"count": 16, "first": [8192, 16384, 24576], "n": 131072}
    assert "T=4111" not in outcome.detail and "4111" in outcome.detail
