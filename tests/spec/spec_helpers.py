"""Small builders shared by the spec tests."""

from __future__ import annotations

from kvspec.spec.config import KVCacheConfig
from kvspec.spec.kv_cache_manager import ComputedBlocks, allocate_slots, get_computed_blocks
from kvspec.spec.releases.profile import Profile
from kvspec.spec.request import Request, RequestStatus, make_request, with_num_computed_tokens, with_status
from kvspec.spec.state import KVCacheManagerState


def config(groups, num_blocks, max_model_len=8192, **kw) -> KVCacheConfig:
    return KVCacheConfig(num_blocks=num_blocks, groups=tuple(groups), max_model_len=max_model_len, **kw)


def admit(state: KVCacheManagerState, req: Request, num_new_tokens: int | None = None, **kw):
    """The scheduler's waiting-loop admission: lookup, then allocate the rest of the prompt.
    Returns (state, request with computed tokens advanced, hit, new blocks)."""
    hit: ComputedBlocks = get_computed_blocks(state, req)
    n = req.num_tokens - hit.num_hit_tokens if num_new_tokens is None else num_new_tokens
    state, new = allocate_slots(state, req, n, hit.num_hit_tokens, hit, **kw)
    if new is not None:
        req = with_status(with_num_computed_tokens(req, hit.num_hit_tokens + n), RequestStatus.RUNNING)
    return state, req, hit, new


__all__ = ["config", "admit", "make_request", "Profile"]
