"""vLLM 0.30: what this release changed in the KV-cache manager, relative to the release before it.

(Filled from the release's own source: docs/releases.md.)
"""

from __future__ import annotations

from kvspec.spec.releases.profile import Change

CHANGES: tuple[Change, ...] = ()
