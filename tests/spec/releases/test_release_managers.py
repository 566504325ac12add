"""The release changes of the single-type managers, the coordinator and ``allocate_slots``.

Each test runs one small scenario on the spec under ``profile_for`` of the release that made a
change and of the release before it, and asserts what real vLLM of those two releases did with the
same operations (observed with ``kvspec``'s vllm target on the light release venvs; each docstring
names the two releases).  Flipping the change's knob back makes the newer release's assertions fail.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from release_helpers import admit, running, tokens

from kvspec.harness.core import ops as O
from kvspec.harness.core.observation import Observation
from kvspec.harness.targets.spec import SpecTarget
from kvspec.spec.config import ConfigError, KVCacheConfig, full_attention, sliding_window
from kvspec.spec.releases.line import CHANGES, profile_for
from kvspec.spec.types import BlockCount, TokenCount


def _run(config: KVCacheConfig, release: str, ops: list[Any]) -> tuple[list[Any], Observation, SpecTarget]:
    """The outcomes of ``ops`` on the spec under ``release``'s profile, and the state after them."""
    target = SpecTarget()
    target.reset(replace(config, profile=profile_for(release)))
    outcomes = [target.apply(op) for op in ops]
    return outcomes, target.observe(), target


def _key_index(obs: Observation, rid: str, key: bytes) -> tuple[int, int]:
    """A map key as (the request's hash index, group id)."""
    hashes = obs.request_block_hashes[rid]
    return hashes.index(key[:-4]), int.from_bytes(key[-4:], "big")


def _changed(name: str) -> str:
    """The release of a named change (the test then checks it and the release before)."""
    return next(c.release for c in CHANGES if c.name == name)


# --- 0.24.0 ----------------------------------------------------------------------------------------


def test_two_phase_external_allocation() -> None:
    """Change ``two_phase_external_allocation``, observed on vLLM 0.23.0 and 0.24.0: groups (full 4,
    full 8); A and D cache 16 tokens each and are freed (only hashed blocks, so the free order of
    0.23 and 0.24 agree: [4,3,2,1,6,5,10,9,8,7,12,11]); B hits A's 16 tokens and loads 4 external
    tokens.  0.23: group 0 touches its hits and pops block 6, group 1's hit (evicting its key), which
    group 1 then touches too (ref_cnt 2); 0.24: every hit is touched first, the external blocks are
    10 and 9."""
    assert _changed("two_phase_external_allocation") == "0.24.0"
    config = KVCacheConfig(BlockCount(13), (full_attention(4), full_attention(8)), TokenCount(64))
    ops = [
        *admit("A", tokens(16)),
        *admit("D", tokens(16, 100)),
        O.Free("A"),
        O.Free("D"),
        O.AddRequest("B", tokens(16) + tokens(9, 200)),
        O.GetComputedBlocks("B"),
        O.AllocateSlots("B", 0, 16, use_computed_blocks=True, num_external_computed_tokens=4, delay_cache_blocks=True),
    ]
    _, old, _ = _run(config, "0.23.0", ops)
    assert [g["B"] for g in old.tables] == [(1, 2, 3, 4, 6), (5, 6, 10)]
    assert old.ref_cnt[6] == 2 and old.block_key[6] is None
    assert list(old.free_queue) == [9, 8, 7, 12, 11]
    _, new, _ = _run(config, "0.24.0", ops)
    assert [g["B"] for g in new.tables] == [(1, 2, 3, 4, 10), (5, 6, 9)]
    assert new.ref_cnt[6] == 1 and new.block_key[6] is not None
    assert list(new.free_queue) == [8, 7, 12, 11]


# --- 0.26.0 ----------------------------------------------------------------------------------------


def test_remove_skipped_blocks_on_processed_tokens() -> None:
    """Change ``remove_skipped_blocks_on_processed_tokens``, observed on vLLM 0.25.1 and 0.26.0:
    sliding window (bs 4, W 4); r0 computes 16 tokens, all 16 still in flight, then allocates 1
    more.  0.25.1 measures the window on 16 (13 tokens skipped: blocks 1-3 freed, to the tail, as
    they are hashed); 0.26.0 on 16 - 16 = 0 (nothing freed)."""
    assert _changed("remove_skipped_blocks_on_processed_tokens") == "0.26.0"
    config = KVCacheConfig(BlockCount(12), (sliding_window(4, 4),), TokenCount(64))
    ops = [
        *admit("r0", tokens(16)),
        *running("r0", 16),
        O.SetNumInFlightTokens("r0", 16),
        O.AllocateSlots("r0", 1),
        O.AddRequest("r1", tokens(4, 50)),
        O.AllocateSlots("r1", 4),
    ]
    out, old, _ = _run(config, "0.25.1", ops)
    assert out[6] == {"block_ids": [[5]]} and out[8] == {"block_ids": [[6]]}
    assert old.tables[0]["r0"] == (0, 0, 0, 4, 5)
    assert list(old.free_queue) == [7, 8, 9, 10, 11, 3, 2, 1]
    out, new, _ = _run(config, "0.26.0", ops)
    assert out[6] == {"block_ids": [[5]]} and out[8] == {"block_ids": [[6]]}
    assert new.tables[0]["r0"] == (1, 2, 3, 4, 5)
    assert list(new.free_queue) == [7, 8, 9, 10, 11]


def _tail_ops(prompt_len: int) -> list[Any]:
    """Groups (full 8, sliding window 4 W 4): hash blocks of 4, scheduler blocks of 8.  The prompt
    is computed, then 4 output tokens, so the full group caches up to ``prompt_len + 4``."""
    return [
        *admit("r0", tokens(prompt_len)),
        O.SetStatus("r0", "RUNNING"),
        O.AppendOutputTokens("r0", tokens(4, 90)),
        O.SetNumComputedTokens("r0", prompt_len),
        O.AllocateSlots("r0", 4),
        O.SetNumComputedTokens("r0", prompt_len + 4),
    ]


_TAIL_CONFIG = KVCacheConfig(BlockCount(20), (full_attention(8), sliding_window(4, 4)), TokenCount(64))


def _tail_entries(release: str, prompt_len: int) -> dict[int, list[tuple[int, int]]]:
    """The partial (secondary) entries after the tail scenario: block -> [(hash index, group)]."""
    _, obs, _ = _run(_TAIL_CONFIG, release, _tail_ops(prompt_len))
    assert obs.tables[0]["r0"] == (1, 2)
    return {b: sorted(_key_index(obs, "r0", k) for k in keys) for b, keys in obs.secondary_keys.items()}


def test_full_attention_partial_tail_entry() -> None:
    """Change ``full_attention_partial_tail_entry``, observed on vLLM 0.25.1 and 0.26.0 (and 0.31.0):
    a 12-token prompt; once the full group caches 16 tokens its block 2 (tokens 8-15) also gets the
    prompt-boundary key at 12 tokens (hash #2, group 0) as a secondary key in 0.26.0; 0.25.1 keeps
    no partial entries."""
    assert _changed("full_attention_partial_tail_entry") == "0.26.0"
    assert _tail_entries("0.25.1", 12) == {}
    assert _tail_entries("0.26.0", 12) == {2: [(2, 0)]}
    assert _tail_entries("0.31.0", 12) == {2: [(2, 0)]}


def test_partial_tail_boundary_prompt_minus_one() -> None:
    """Change ``partial_tail_boundary_prompt_minus_one``, observed on vLLM 0.31.0 and 0.32.0: with a
    12-token prompt 0.31.0 keys block 2 (tokens 8-15) at 12 tokens, 0.32.0 rounds 11 down to 8, a block boundary
    (no entry); with an 8-token prompt 0.31.0's boundary 8 is a block boundary (no entry) and
    0.32.0 keys block 1 (tokens 0-7) at 4 tokens (hash #0, group 0)."""
    assert _changed("partial_tail_boundary_prompt_minus_one") == "0.32.0"
    assert _tail_entries("0.31.0", 12) == {2: [(2, 0)]}
    assert _tail_entries("0.32.0", 12) == {}
    assert _tail_entries("0.31.0", 8) == {}
    assert _tail_entries("0.32.0", 8) == {1: [(0, 0)]}
    assert _tail_entries("0.25.1", 8) == {}


# --- 0.29.0 ----------------------------------------------------------------------------------------


def test_hybrid_lookup_truncates_every_full_attention_group() -> None:
    """Change ``hybrid_lookup_truncates_every_full_attention_group``, observed on vLLM 0.28.0 and
    0.29.0 (the trigger of the 0.29.0 analysis): groups (full 4, full 8, sliding window 4 W 4); A
    caches 32 of 33 tokens, its sliding-window block for tokens 28-31 (block 22) is evicted, B
    resends the prompt: hit 24 tokens.  0.28.0 leaves the full-8 group 4 blocks (its first search)
    and B's admission adopts block 13; 0.29.0 cuts it to 3 and allocates two fresh blocks."""
    assert _changed("hybrid_lookup_truncates_every_full_attention_group") == "0.29.0"
    config = KVCacheConfig(BlockCount(40), (full_attention(4), full_attention(8), sliding_window(4, 4)), TokenCount(64))
    ops = [
        *admit("A", tokens(33)),
        *running("A", 33),
        O.EvictBlocks((22,)),
        O.AddRequest("B", tokens(33)),
        O.GetComputedBlocks("B"),
        O.AllocateSlots("B", 9, 24, use_computed_blocks=True),
    ]
    out, old, _ = _run(config, "0.28.0", ops)
    assert out[7] == {"block_ids": [[1, 2, 3, 4, 5, 6], [10, 11, 12, 13], [0, 0, 0, 0, 0, 20]], "num_hit_tokens": 24}
    assert out[8] == {"block_ids": [[24, 25, 26], [27], [28, 29, 30]]}
    assert old.tables[1]["B"] == (10, 11, 12, 13, 27) and old.ref_cnt[13] == 2
    out, new, _ = _run(config, "0.29.0", ops)
    assert out[7] == {"block_ids": [[1, 2, 3, 4, 5, 6], [10, 11, 12], [0, 0, 0, 0, 0, 20]], "num_hit_tokens": 24}
    assert out[8] == {"block_ids": [[24, 25, 26], [27, 28], [29, 30, 31]]}
    assert new.tables[1]["B"] == (10, 11, 12, 27, 28) and new.ref_cnt[13] == 1


def test_hybrid_allows_single_cacheable_spec_group() -> None:
    """Change ``hybrid_allows_single_cacheable_spec_group``, observed on vLLM 0.28.0 (and 0.23.0:
    ``KVCacheManager`` raises AssertionError "requires at least two attention groups") and 0.29.0
    (builds; both groups hit jointly: [[1, 2], [4, 5]], 8 tokens)."""
    assert _changed("hybrid_allows_single_cacheable_spec_group") == "0.29.0"
    config = KVCacheConfig(BlockCount(10), (full_attention(4), full_attention(4)), TokenCount(64))
    for release in ("0.23.0", "0.28.0"):
        with pytest.raises(ConfigError, match="all share one spec"):
            replace(config, profile=profile_for(release)).validate()
    replace(config, enable_caching=False, profile=profile_for("0.28.0")).validate()  # no hybrid coordinator
    ops = [
        *admit("A", tokens(9)),
        O.AddRequest("B", tokens(9)),
        O.GetComputedBlocks("B"),
    ]
    out, _, _ = _run(config, "0.29.0", ops)
    assert out[2] == {"block_ids": [[1, 2, 3], [4, 5, 6]]}
    assert out[4] == {"block_ids": [[1, 2], [4, 5]], "num_hit_tokens": 8}


# --- 0.31.0 ----------------------------------------------------------------------------------------


def test_allocate_slots_zero_new_tokens_with_hits() -> None:
    """Change ``allocate_slots_zero_new_tokens_with_hits``, observed on vLLM 0.30.0 and 0.31.0: R
    hits 8 tokens of R0's cached blocks 1 and 2 and asks for 0 new tokens.  0.30.0 raises
    ValueError (nothing changes); 0.31.0 adopts the hits (ref_cnt 2) and returns no new block."""
    assert _changed("allocate_slots_zero_new_tokens_with_hits") == "0.31.0"
    config = KVCacheConfig(BlockCount(10), (full_attention(4),), TokenCount(64))
    ops = [
        *admit("R0", tokens(9)),
        O.AddRequest("R", tokens(8) + (77,)),
        O.GetComputedBlocks("R"),
    ]
    adopt = O.AllocateSlots("R", 0, 8, use_computed_blocks=True)
    _, _, target = _run(config, "0.30.0", ops)
    with pytest.raises(ValueError, match="must be greater than 0"):
        target.apply(adopt)
    assert "R" not in target.observe().tables[0]
    out, new, _ = _run(config, "0.31.0", [*ops, adopt])
    assert out[-1] == {"block_ids": [[]]}
    assert new.tables[0]["R"] == (1, 2) and new.ref_cnt[1] == new.ref_cnt[2] == 2
    assert new.num_cached_block[0]["R"] == 2


# --- 0.33.0 ----------------------------------------------------------------------------------------


def test_cache_full_blocks_capped_by_hashes() -> None:
    """Change ``cache_full_blocks_capped_by_hashes``, observed on vLLM 0.32.0 and 0.33.0: A (6
    tokens, 1 hash) caches its one full block; ``cache_blocks(A, 8)`` asks for a second: 0.32.0
    raises IndexError, 0.33.0 caps at the hashes (a no-op)."""
    assert _changed("cache_full_blocks_capped_by_hashes") == "0.33.0"
    config = KVCacheConfig(BlockCount(10), (full_attention(4),), TokenCount(64))
    ops = admit("A", tokens(6))
    _, _, target = _run(config, "0.32.0", ops)
    with pytest.raises(IndexError):
        target.apply(O.CacheBlocks("A", 8))
    target.apply(O.CacheBlocks("A", 4))  # within the hashes: fine in every release
    _, new, _ = _run(config, "0.33.0", [*ops, O.CacheBlocks("A", 8)])
    assert new.num_cached_block[0]["A"] == 1 and new.tables[0]["A"] == (1, 2)


def test_external_tokens_cut_to_the_window() -> None:
    """Change ``external_tokens_cut_to_the_window``, observed on vLLM 0.23.0 and 0.24.0: a sliding
    window of 1 token in blocks of 2, caching off, max_model_len 1; one prompt token plus one
    external token.  0.23 allocates a real block for the external token (only a whole skipped
    block cuts it) and the allocation returns no new block; 0.24 cuts it and returns block 1.
    Both leave blocks 2 and 3 free."""
    assert _changed("external_tokens_cut_to_the_window") == "0.24.0"
    config = KVCacheConfig(BlockCount(4), (sliding_window(2, 1),), TokenCount(1), enable_caching=False)
    ops = [
        O.AddRequest("r1", (1,)),
        O.GetComputedBlocks("r1"),
        O.AllocateSlots("r1", 1, use_computed_blocks=True, num_external_computed_tokens=1, full_sequence_must_fit=True),
    ]
    for release, new in (("0.23.0", [[]]), ("0.24.0", [[1]])):
        outs, obs, _ = _run(config, release, ops)
        assert outs[-1] == {"block_ids": new}, release
        assert obs.tables[0]["r1"] == (1,) and list(obs.free_queue) == [2, 3], release
