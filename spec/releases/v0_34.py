"""vLLM 0.34.0: what this release changed in the KV-cache manager, relative to 0.33.0.

Modelled here (what kvspec's operations can observe):
- ``hit_limit_from_logprob_start``: a request's prefix-cache reads are bounded by its hit limit.

Seen and not a behaviour change for the manager (the adapter or nothing needs them): the hash map
holds block ids (``BlockHashToBlockMap._cache`` + ``_dup_ids``, same lookup order); ``KVCacheBlock``'s
``block_hash`` / ``block_hash_num_tokens`` are plain fields; the group-id suffix is precomputed per
call (same key bytes); ``get_num_cached_tokens`` is a new read-only probe and
``get_num_common_prefix_blocks`` is gone (kvspec calls neither); an explicit ``max_cache_hit_length``
is clamped to the request's own cap (kvspec passes none); ``Request`` may take precomputed prompt
block hashes (kvspec passes none).  docs/releases.md has the full list.
"""

from __future__ import annotations

from kvspec.spec.releases.profile import Change

CHANGES: tuple[Change, ...] = (
    Change(
        name="hit_limit_from_logprob_start",
        release="0.34.0",
        models="Request.get_prefix_cache_hit_limit, Request.get_max_cache_hit_length, "
        "KVCacheManager.prefix_cache_lookup_enabled, KVCacheManager.get_computed_blocks",
        summary="A request asking for prompt logprobs with cache reads allowed (skip_reading_prefix_cache=False) "
        "reads the prefix cache only up to its first scored prompt row (prompt_logprob_start, 0 by default: no "
        "read at all); up to 0.33 it read the whole cache.  Observable: get_computed_blocks' hit length and blocks.",
        knob="hit_limit_from_logprob_start",
        before=False,
        after=True,
    ),
)
