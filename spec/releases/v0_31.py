"""vLLM 0.31: what this release changed in the KV-cache manager, relative to the release before it.

(Filled from the release's own source: docs/releases.md.)
"""

from __future__ import annotations

from kvspec.spec.releases.profile import Change

CHANGES: tuple[Change, ...] = (
    Change(
        name="allocate_slots_zero_new_tokens_with_hits",
        release="0.31.0",
        models="KVCacheManager.allocate_slots (first check)",
        summary=(
            "allocate_slots with no new and no external tokens but a local prefix hit adopts the hits "
            "(touching them, caching what they cover) and returns no new blocks; before, it raised ValueError "
            "whenever num_new_tokens and num_external_computed_tokens were both 0."
        ),
        knob="allocate_adopt_only",
        before=False,
        after=True,
    ),
    Change(
        name="tagged_block_hash_extra_keys",
        release="0.31.0",
        models=(
            "vllm/v1/core/kv_cache_utils.py: generate_block_hash_extra_keys, _gen_lora_extra_hash_keys, "
            "_gen_mm_extra_hash_keys, _gen_prompt_embeds_extra_hash_keys"
        ),
        summary=(
            "Extra keys were bare values: the LoRA adapter's name (not its path), (identifier, offset) "
            "per multimodal item, the salt, the embeddings digest; from 0.31 each is a tuple tagged with "
            "its source, the adapter keyed by name and path. Observable: the hash of every block of a "
            "LoRA, multimodal, salted or embeddings request; before 0.31 two adapters sharing a name "
            "shared cached blocks (a prefix hit), and so did a LoRA request without salt and a salted "
            "request without LoRA whose salt equals the adapter's name (their first block)."
        ),
        knob="extra_key_form",
        before="bare",
        after="tagged",
    ),
    Change(
        name="incremental_mm_extra_key_lookup",
        release="0.31.0",
        models="vllm/v1/core/kv_cache_utils.py: get_request_block_hasher",
        summary=(
            "A block hashed after the request was created (completed by output tokens) was keyed only "
            "on the request's last multimodal item; from 0.31 on every item overlapping it, as at "
            "creation. Observable: before 0.31, requests whose prompts end in the same tail differing "
            "only in an earlier item of that tail key the block alike, so one hits the other's block."
        ),
        knob="mm_resume_scan",
        before="last_item",
        after="window",
    ),
)
