"""vLLM 0.24: what this release changed in the KV-cache manager, relative to the release before it.

(Filled from the release's own source: docs/releases.md.)
"""

from __future__ import annotations

from kvspec.spec.releases.profile import Change

CHANGES: tuple[Change, ...] = (
    Change(
        name="two_phase_external_allocation",
        release="0.24.0",
        models="KVCacheCoordinator.allocate_new_computed_blocks",
        summary=(
            "Admission first touches every group's prefix hits, then allocates the external-token blocks "
            "group by group; before, each group touched its hits and took its external blocks before the next "
            "group touched its own, so one group could pop (and evict) a later group's hit from the free queue "
            "and both tables ended up holding it (vLLM issue #33775).  Observable: block ids, ref counts, "
            "BlockRemoved events, free-queue order, with two or more groups and external tokens."
        ),
        knob="external_allocation",
        before="per_group",
        after="two_phase",
    ),
    Change(
        name="free_queue_split_for_every_manager",
        release="0.24.0",
        models="BlockPool.free_blocks, SingleTypeKVCacheManager.free",
        summary=(
            "free of a full-attention, chunked-local or cross-attention group splits the freed blocks "
            "like sliding window's free and remove_skipped_blocks always did: unhashed ones (all, with "
            "caching off) to the front of the free queue, hashed ones to the tail.  In 0.23 that free "
            "appended every block, so a finished request's unhashed blocks were reused after every "
            "free cached block, and different block ids came back from the next allocation."
        ),
        knob="finish_free_order",
        before="append",
        after="split",
    ),
    Change(
        name="coarse_group_hash_is_last_fine_hash",
        release="0.24.0",
        models="vllm/v1/core/kv_cache_utils.py: BlockHashListWithBlockSize",
        summary=(
            "A group whose block is s hash blocks wide keyed its block j on the s fine hashes of the "
            "block concatenated; from 0.24 on the last of them alone (hashes chain, so it names the "
            "whole prefix). Observable: the hash-map keys of such groups (hybrids of different block "
            "sizes, a hash block size override); lookups use the same view, so hits do not change, and "
            "int KV events carry the low 64 bits, the same either way."
        ),
        knob="coarse_block_key",
        before="concatenated",
        after="last_fine_hash",
    ),
    Change(
        name="external_tokens_cut_to_the_window",
        release="0.24.0",
        models="SingleTypeKVCacheManager.allocate_external_computed_blocks (0.23: allocate_new_computed_blocks)",
        summary=(
            "External (KV-connector) tokens already out of a window are cut before their blocks are "
            "allocated whenever any token is skipped; in 0.23 only once a whole block was, so a window "
            "shorter than a block got a real block for an external token it skips and the next "
            "allocation returned no new block.  Observable: allocate_slots' new blocks, free-queue length."
        ),
        knob="external_skip_clamp",
        before="blocks",
        after="tokens",
    ),
)
