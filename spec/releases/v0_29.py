"""vLLM 0.29: what this release changed in the KV-cache manager, relative to the release before it.

(Filled from the release's own source: docs/releases.md.)
"""

from __future__ import annotations

from kvspec.spec.releases.profile import Change

CHANGES: tuple[Change, ...] = (
    Change(
        name="hybrid_lookup_truncates_every_full_attention_group",
        release="0.29.0",
        models="HybridKVCacheCoordinator.find_longest_cache_hit",
        summary=(
            "After the fixed point every full-attention spec group's hit list is cut to the final hit length; "
            "before, only the first spec group's (full attention sorts first), so a second full-attention spec "
            "group (another block size) kept the blocks of its first search even when a later group lowered "
            "the hit, and admission adopted them as hits that the recompute then overwrites.  Observable: "
            "get_computed_blocks lists, ref counts, new block counts (the hit length is the same)."
        ),
        knob="hybrid_hit_trim",
        before="first_group",
        after="every_full_group",
    ),
    Change(
        name="hybrid_allows_single_cacheable_spec_group",
        release="0.29.0",
        models="HybridKVCacheCoordinator.verify_and_split_kv_cache_groups",
        summary=(
            "A hybrid coordinator (caching on, several groups) whose groups all share one spec is built and "
            "looks the groups up jointly; before, its constructor asserted at least two distinct specs.  "
            "Observable: the config is refused (ConfigError) under the older profiles."
        ),
        knob="hybrid_single_spec_group",
        before=False,
        after=True,
    ),
    Change(
        name="none_hash_default_seed",
        release="0.29.0",
        models="vllm/v1/core/kv_cache_utils.py: init_none_hash, resolve_none_hash_seed",
        summary=(
            "With PYTHONHASHSEED unset, NONE_HASH (the parent of every request's first block) was 32 "
            "random bytes drawn at each init_none_hash, so no two processes (or resets) agreed on any "
            "block hash; from 0.29 sha256 and sha256_cbor hash the constant seed 'vllm-none-hash'. "
            "Observable: every block hash and hash-map key (hits inside one process are unchanged)."
        ),
        knob="none_hash_seed",
        before="random",
        after="fixed",
    ),
)
