"""vLLM 0.28: what this release changed in the KV-cache manager, relative to the release before it.

(Filled from the release's own source: docs/releases.md.)
"""

from __future__ import annotations

from kvspec.spec.releases.profile import Change

CHANGES: tuple[Change, ...] = (
    Change(
        name="free_order_caching_disabled_lifo",
        release="0.28.0",
        models="BlockPool.free_blocks",
        summary=(
            "Undoes 0.27's caching-off order: with prefix caching off, freed blocks go to the front of "
            "the free queue again (LIFO reuse), so the most recently freed block is allocated next."
        ),
        knob="caching_off_free_order",
        before="tail",
        after="front",
    ),
)
