"""The steps of ``allocate_slots`` (docs/semantics.md §3.1), one function each.

``spec.kv_cache_manager.allocate_slots`` is the list of these steps in order; each models one
stretch of vLLM 0.33 ``KVCacheManager.allocate_slots``.  They only read and pass on the token
counts of ``arith.SlotTargets``, the layout ``| comp | new_comp | ext_comp | new | lookahead |``.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvspec.spec import arith, block_pool, coordinator
from kvspec.spec.config import KVCacheConfig
from kvspec.spec.request import Request, RequestStatus
from kvspec.spec.state import KVCacheManagerState
from kvspec.spec.types import GroupBlockIds


def verify_non_negative_counts(op: str, counts: Mapping[str, int]) -> None:
    """Precondition of an operation: every count is a non-negative ``int`` (else the caller has a
    bug, which is a ``ValueError``, never an allocation outcome)."""
    for name, value in counts.items():
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{op}: {name} must be a non-negative int, got {value!r}")


def is_empty_allocation(num_new_tokens: int, num_new_computed_tokens: int, num_external_computed_tokens: int) -> bool:
    """Step 1: no token to compute and none to adopt; vLLM 0.33 rejects such a call."""
    return num_new_tokens == 0 and num_external_computed_tokens == 0 and num_new_computed_tokens == 0


def is_admission(request: Request) -> bool:
    """The request is being admitted (first time or after preemption), not continued."""
    return request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)


def get_watermark_blocks(config: KVCacheConfig, request: Request, has_scheduled_reqs: bool) -> int:
    """Step 3: the blocks held back from an admission while other requests are scheduled."""
    if has_scheduled_reqs and is_admission(request):
        return config.watermark_blocks
    return 0


def has_free_blocks(state: KVCacheManagerState, num_blocks: int, reserved_blocks: int = 0) -> bool:
    """Steps 4 and 7: ``num_blocks`` fit in the free queue (evictable cached blocks included) once
    ``reserved_blocks`` are set aside."""
    return num_blocks <= block_pool.get_num_free_blocks(state.pool) - reserved_blocks


def get_num_blocks_for_full_sequence(
    state: KVCacheManagerState, request: Request, hits: GroupBlockIds, num_encoder_tokens: int, t: arith.SlotTargets
) -> int:
    """Step 4 (``full_sequence_must_fit``): the blocks the whole request (up to ``max_model_len``)
    would need, with window kinds capped at their recycling bound (the admission cap)."""
    full_tokens = min(request.num_tokens, state.config.max_model_len)
    return coordinator.get_num_blocks_to_allocate(
        state,
        request.request_id,
        full_tokens,
        hits,
        num_encoder_tokens,
        t.total_computed_tokens,
        apply_admission_cap=True,
    )


def get_num_processed_tokens(request: Request, t: arith.SlotTargets) -> int:
    """Step 5: the tokens whose KV is written, on which the window is measured (the clamped
    computed total less those still in flight)."""
    return max(0, t.total_computed_tokens - request.num_in_flight_tokens)


def get_window_basis_tokens(config: KVCacheConfig, request: Request, t: arith.SlotTargets) -> int:
    """Step 5 under the config's release: the processed count from vLLM 0.26 on.  Before 0.26
    (``Profile.window_free_basis == "computed"``, Change ``remove_skipped_blocks_on_processed_tokens``)
    there is no in-flight count and the window is measured on the whole computed total, which frees
    blocks an in-flight step may still need."""
    if config.profile.window_free_basis == "computed":
        return t.total_computed_tokens
    return get_num_processed_tokens(request, t)


def is_empty_allocation_for(
    config: KVCacheConfig, num_new_tokens: int, num_new_computed_tokens: int, num_external_computed_tokens: int
) -> bool:
    """Step 1 under the config's release: before 0.31 (``Profile.allocate_adopt_only`` False, Change
    ``allocate_slots_zero_new_tokens_with_hits``) a call with no new and no external tokens is
    rejected even when it would adopt prefix hits."""
    if not config.profile.allocate_adopt_only:
        return num_new_tokens == 0 and num_external_computed_tokens == 0
    return is_empty_allocation(num_new_tokens, num_new_computed_tokens, num_external_computed_tokens)


def get_num_blocks_to_allocate(
    state: KVCacheManagerState, request: Request, hits: GroupBlockIds, num_encoder_tokens: int, t: arith.SlotTargets
) -> int:
    """Step 6: the blocks this call will take off the free queue, fresh ones plus evictable hits
    (the predictor gets the unclamped computed total)."""
    return coordinator.get_num_blocks_to_allocate(
        state, request.request_id, t.num_tokens_need_slot, hits, num_encoder_tokens, t.num_total_computed_unclamped
    )


def adopt_computed_blocks(
    state: KVCacheManagerState,
    request: Request,
    hits: GroupBlockIds,
    num_external_computed_tokens: int,
    t: arith.SlotTargets,
) -> KVCacheManagerState:
    """Step 8: touch the prefix hits in every group, then allocate blocks for the external tokens
    (two phases, so no fresh block evicts a hit about to be adopted).  Nothing to do without hits
    or external tokens."""
    has_hits = any(hits)
    if not has_hits and num_external_computed_tokens == 0:
        return state
    adopted = hits if has_hits else tuple(() for _ in state.config.groups)
    return coordinator.allocate_new_computed_blocks(
        state, request.request_id, adopted, t.num_local_computed_tokens, num_external_computed_tokens
    )
