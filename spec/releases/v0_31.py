"""vLLM 0.31: what this release changed in the KV-cache manager, relative to the release before it.

(Filled from the release's own source: docs/releases.md.)
"""

from __future__ import annotations

from spec.releases.profile import Change

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
)
