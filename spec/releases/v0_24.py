"""vLLM 0.24: what this release changed in the KV-cache manager, relative to the release before it.

(Filled from the release's own source: docs/releases.md.)
"""

from __future__ import annotations

from spec.releases.profile import Change

CHANGES: tuple[Change, ...] = (
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
)
