"""vLLM 0.27: what this release changed in the KV-cache manager, relative to the release before it.

(Filled from the release's own source: docs/releases.md.)
"""

from __future__ import annotations

from kvspec.spec.releases.profile import Change

CHANGES: tuple[Change, ...] = (
    Change(
        name="free_order_with_caching_disabled",
        release="0.27.0",
        models="BlockPool.free_blocks",
        summary=(
            "With prefix caching off, freed blocks go to the tail of the free queue (FIFO reuse) "
            "instead of the front; with caching on nothing changes.  Observable as the block ids later "
            "allocations return, after free and after remove_skipped_blocks."
        ),
        knob="caching_off_free_order",
        before="front",
        after="tail",
    ),
)
