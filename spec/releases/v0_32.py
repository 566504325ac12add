"""vLLM 0.32: what this release changed in the KV-cache manager, relative to the release before it.

(Filled from the release's own source: docs/releases.md.)
"""

from __future__ import annotations

from kvspec.spec.releases.profile import Change

CHANGES: tuple[Change, ...] = (
    Change(
        name="partial_tail_boundary_prompt_minus_one",
        release="0.32.0",
        models="FullAttentionManager._cache_partial_tail_block",
        summary=(
            "The prompt-tail partial entry sits at num_prompt_tokens - 1 rounded down to hash blocks (the "
            "longest hit a resend of the prompt can have); before, at num_prompt_tokens rounded down, so a "
            "prompt that is a whole number of hash blocks but not of the group's blocks published an entry "
            "no lookup could reach.  Observable: hash-map keys, secondary keys, events."
        ),
        knob="partial_tail_boundary",
        before="prompt",
        after="prompt_minus_one",
    ),
)
