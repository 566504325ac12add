"""vLLM 0.33: what this release changed in the KV-cache manager, relative to the release before it.

(Filled from the release's own source: docs/releases.md.)
"""

from __future__ import annotations

from kvspec.spec.releases.profile import Change

CHANGES: tuple[Change, ...] = (
    Change(
        name="cache_full_blocks_capped_by_hashes",
        release="0.33.0",
        models="SingleTypeKVCacheManager.cache_blocks",
        summary=(
            "cache_blocks caches only the full blocks the request has hashes for; before, asking for more "
            "(a direct cache_blocks past request.num_tokens) failed inside BlockPool.cache_full_blocks "
            "(IndexError from 0.26, AssertionError in 0.24-0.25) after keying some blocks.  Observable: "
            "errors; the scheduler never asks this."
        ),
        knob="cache_past_hashes",
        before="raise",
        after="cap",
    ),
)
