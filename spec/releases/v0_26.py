"""vLLM 0.26: what this release changed in the KV-cache manager, relative to the release before it.

(Filled from the release's own source: docs/releases.md.)
"""

from __future__ import annotations

from kvspec.spec.releases.profile import Change

CHANGES: tuple[Change, ...] = (
    Change(
        name="remove_skipped_blocks_on_processed_tokens",
        release="0.26.0",
        models="KVCacheManager.allocate_slots (step 5, coordinator.remove_skipped_blocks)",
        summary=(
            "Blocks out of the sliding window or local chunk are freed on the processed count, the computed "
            "total less Request.num_in_flight_tokens (new in 0.26); before, on the whole computed total, which "
            "under async scheduling already counts steps not yet run, so blocks an in-flight step may still "
            "need (after a draft rollback) were freed and reused.  Observable: block ids, free-queue order, "
            "null positions in the tables."
        ),
        knob="window_free_basis",
        before="computed",
        after="processed",
    ),
    Change(
        name="full_attention_partial_tail_entry",
        release="0.26.0",
        models="FullAttentionManager.cache_blocks, FullAttentionManager._cache_partial_tail_block",
        summary=(
            "A full-attention group whose block is wider than the hash block also publishes the prompt's last "
            "hash boundary inside a block as a partial entry (its hash with the group id; a secondary key when "
            "the block already has one), at num_prompt_tokens rounded down to hash blocks; before, no partial "
            "entries.  Observable: hash-map keys, secondary keys, BlockStored / BlockRemoved events."
        ),
        knob="partial_tail_boundary",
        before="none",
        after="prompt",
    ),
)
