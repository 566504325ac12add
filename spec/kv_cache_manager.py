"""The KV-cache manager's operations, as the scheduler calls them.

Models vLLM 0.33.0 ``vllm/v1/core/kv_cache_manager.py`` (``KVCacheManager``) for the core scope.
Each operation takes the state and returns a new state with its outcome; running out of blocks is
the outcome ``None`` (as in vLLM), a caller's misuse is an ``AssertionError`` / ``ValueError``.

The heart is ``allocate_slots``, whose token layout (from the vLLM docstring; docs/semantics.md
§3.1) is::

    | comp | new_comp | ext_comp | new (incl. unverified drafts) | lookahead |
    |<------ computed --------->|<------------ to compute ------------------->|
                  |<---------------------- to be allocated ------------------>|
    comp      = request.num_computed_tokens (blocks already owned)
    new_comp  = num_new_computed_tokens (local prefix hit; blocks not yet touched)
    ext_comp  = num_external_computed_tokens (a KV connector writes them; blocks needed)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvspec.spec import arith, block_pool, coordinator
from kvspec.spec.config import KVCacheConfig
from kvspec.spec.events import Event
from kvspec.spec.request import Request, get_prefix_cache_hit_limit
from kvspec.spec.slot_allocation import (
    adopt_computed_blocks,
    get_num_blocks_for_full_sequence,
    get_num_blocks_to_allocate,
    get_watermark_blocks,
    get_window_basis_tokens,
    has_free_blocks,
    is_empty_allocation_for,
    verify_non_negative_counts,
)
from kvspec.spec.state import KVCacheManagerState, init_state, with_pool
from kvspec.spec.types import GroupBlockIds, RequestId

"""One tuple of block ids per KV-cache group (vLLM ``KVCacheBlocks.get_block_ids()``)."""


@dataclass(frozen=True, slots=True)
class ComputedBlocks:
    """vLLM 0.33 ``get_computed_blocks`` result: the hit blocks per group (null placeholders at
    skipped positions), the hit length, and the hybrid shared-prefix boundary (0 for one group)."""

    blocks: GroupBlockIds
    num_hit_tokens: int
    shared_prefix_boundary: int = 0

    @property
    def is_empty(self) -> bool:
        """vLLM compares against its empty sentinel, which ``create_kv_cache_blocks`` returns
        whenever every group's list is empty."""
        return not any(self.blocks)


def init_kv_cache_manager(config: KVCacheConfig, persistent: bool | None = None) -> KVCacheManagerState:
    """vLLM 0.33 ``KVCacheManager.__init__``: a fresh pool (block 0 null) and empty tables.
    Raises ``ConfigError`` for a config that cannot exist.  ``persistent``: the pool's
    representation (``spec.block_pool.init_block_pool``; None chooses by size)."""
    return init_state(config, persistent)


def usage(state: KVCacheManagerState) -> float:
    """vLLM 0.33 ``KVCacheManager.usage``."""
    return block_pool.get_usage(state.pool)


def is_prefix_cache_lookup_enabled(state: KVCacheManagerState, request: Request) -> bool:
    """vLLM 0.33/0.34 ``prefix_cache_lookup_enabled``: caching on and a hit limit other than 0
    (``spec.request.get_prefix_cache_hit_limit``; prompt-logprob requests skip the cache)."""
    return state.config.enable_caching and get_prefix_cache_hit_limit(request, state.config.profile) != 0


def get_max_cache_hit_length(state: KVCacheManagerState, request: Request) -> int:
    """vLLM 0.34 ``Request.get_max_cache_hit_length``: ``num_tokens - 1`` (one token is always
    recomputed), tightened by the request's hit limit where it has one (0.34 on)."""
    cap = arith.get_max_cache_hit_length(request.num_tokens)
    limit = get_prefix_cache_hit_limit(request, state.config.profile)
    return cap if limit is None else min(cap, limit)


def get_computed_blocks(state: KVCacheManagerState, request: Request) -> ComputedBlocks:
    """vLLM 0.33 ``KVCacheManager.get_computed_blocks``; pure (no touch, no queue change).

    The cap is ``num_tokens - 1``: at least one token is recomputed to sample from its logits, so a
    block-aligned prompt recomputes its whole last block.
    """
    empty = tuple(() for _ in state.config.groups)
    if not is_prefix_cache_lookup_enabled(state, request):
        return ComputedBlocks(empty, 0, 0)
    cap = get_max_cache_hit_length(state, request)
    blocks, hit, uncached = coordinator.find_longest_cache_hit(state, request.block_hashes, cap)
    return ComputedBlocks(blocks, hit, hit + uncached if uncached else 0)


def get_hit_blocks(config: KVCacheConfig, new_computed_blocks: ComputedBlocks | None) -> GroupBlockIds:
    """The prefix hits ``allocate_slots`` is asked to adopt, one tuple per group (``()`` when no
    lookup result is passed)."""
    if new_computed_blocks is None:
        return ()
    if not new_computed_blocks.is_empty:
        assert len(new_computed_blocks.blocks) == len(config.groups), "new_computed_blocks must hold one list per group"
    return new_computed_blocks.blocks


def allocate_slots(
    state: KVCacheManagerState,
    request: Request,
    num_new_tokens: int,
    num_new_computed_tokens: int = 0,
    new_computed_blocks: ComputedBlocks | None = None,
    num_lookahead_tokens: int = 0,
    num_external_computed_tokens: int = 0,
    delay_cache_blocks: bool = False,
    num_encoder_tokens: int = 0,
    full_sequence_must_fit: bool = False,
    reserved_blocks: int = 0,
    has_scheduled_reqs: bool = True,
) -> tuple[KVCacheManagerState, GroupBlockIds | None]:
    """vLLM 0.33 ``KVCacheManager.allocate_slots``: the new blocks per group, or None.

    All or nothing: the block count is predicted and checked before anything is touched or taken;
    the only change that survives a None is step 5, freeing blocks that fell out of the window.
    Returns only the newly allocated blocks (hits are not returned); empty tuples mean success
    with nothing new needed.  The steps are those of docs/semantics.md §3.1.
    """
    # Preconditions: a caller bug, not an allocation outcome.
    verify_non_negative_counts(
        "allocate_slots",
        {
            "num_new_tokens": num_new_tokens,
            "num_new_computed_tokens": num_new_computed_tokens,
            "num_lookahead_tokens": num_lookahead_tokens,
            "num_external_computed_tokens": num_external_computed_tokens,
            "num_encoder_tokens": num_encoder_tokens,
            "reserved_blocks": reserved_blocks,
        },
    )
    # 1. Nothing to allocate and nothing to adopt (vLLM 0.33 raises).
    if is_empty_allocation_for(state.config, num_new_tokens, num_new_computed_tokens, num_external_computed_tokens):
        raise ValueError("num_new_tokens must be greater than 0 when there are no computed tokens to adopt")
    hits = get_hit_blocks(state.config, new_computed_blocks)
    # 2. Token counts of the layout, with the two max_model_len clamps.
    t = arith.compute_slot_targets(
        request.num_computed_tokens,
        num_new_computed_tokens,
        num_external_computed_tokens,
        num_new_tokens,
        num_lookahead_tokens,
        state.config.max_model_len,
    )
    # 3. The watermark only holds back admissions, and only when someone else is scheduled.
    watermark = get_watermark_blocks(state.config, request, has_scheduled_reqs)
    # 4. Full-sequence gate: refuse early, with no change at all, if the whole request cannot fit.
    if full_sequence_must_fit:
        need_full = get_num_blocks_for_full_sequence(state, request, hits, num_encoder_tokens, t)
        if not has_free_blocks(state, need_full + watermark):
            return state, None
    # 5. Free blocks out of the window before counting (fewer evictions); survives a None.
    processed = get_window_basis_tokens(state.config, request, t)
    state = coordinator.remove_skipped_blocks(state, request.request_id, processed)
    # 6. Predict the blocks this call takes from the free queue.
    need = get_num_blocks_to_allocate(state, request, hits, num_encoder_tokens, t)
    # 7. Check capacity: nothing has been touched or taken yet.
    if not has_free_blocks(state, need + watermark, reserved_blocks):
        return state, None
    # 8. Adopt hits (touch them first), then allocate blocks for external tokens.
    state = adopt_computed_blocks(state, request, hits, num_external_computed_tokens, t)
    # 9. Allocate new blocks up to the slot target.
    state, new_blocks = coordinator.allocate_new_blocks(
        state, request.request_id, t.num_tokens_need_slot, num_encoder_tokens
    )
    # 10. P/D: the KV is still in flight; the scheduler caches on arrival.
    if delay_cache_blocks:
        return state, new_blocks
    # 11. Cache up to the verified tokens: drafts and lookahead slots are never published.
    num_to_cache = arith.get_num_tokens_to_cache(t.total_computed_tokens, num_new_tokens, request.num_tokens)
    return coordinator.cache_blocks(state, request, num_to_cache), new_blocks


def free(state: KVCacheManagerState, request_id: str) -> KVCacheManagerState:
    """vLLM 0.33 ``KVCacheManager.free``: release every group's table (tail first); hashes stay,
    so freed cached blocks remain hittable until reused.  An unknown request is a no-op."""
    return coordinator.free(state, RequestId(request_id))


def cache_blocks(state: KVCacheManagerState, request: Request, num_computed_tokens: int) -> KVCacheManagerState:
    """vLLM 0.33 ``KVCacheManager.cache_blocks`` (P/D arrival, early caching of verified tokens)."""
    _require_known(state, request.request_id, "cache_blocks")
    if num_computed_tokens < 0:
        raise ValueError(f"cache_blocks: num_computed_tokens must be >= 0, got {num_computed_tokens}")
    return coordinator.cache_blocks(state, request, num_computed_tokens)


def remove_skipped_blocks(state: KVCacheManagerState, request_id: str, num_computed_tokens: int) -> KVCacheManagerState:
    """vLLM 0.33 ``KVCacheManager.remove_skipped_blocks``.  The scheduler also calls it for
    requests that hold nothing (finished ones, with a connector): a no-op for full attention, an
    empty table entry for window kinds (vLLM's defaultdict)."""
    if num_computed_tokens < 0:
        raise ValueError(f"remove_skipped_blocks: num_computed_tokens must be >= 0, got {num_computed_tokens}")
    return coordinator.remove_skipped_blocks(state, RequestId(request_id), num_computed_tokens)


def _require_known(state: KVCacheManagerState, request_id: RequestId, op: str) -> None:
    """For an unknown request vLLM's ``cache_blocks`` invents an empty table and then records
    cached blocks it does not hold; the scheduler never asks that, so the spec treats it as the
    caller's bug."""
    if not any(request_id in g.req_to_blocks for g in state.groups):
        raise ValueError(f"{op}: unknown request {request_id!r} (it holds no blocks)")


def evict_blocks(state: KVCacheManagerState, block_ids: Iterable[int]) -> KVCacheManagerState:
    """vLLM 0.33 ``KVCacheManager.evict_blocks``: drop the hashes of these blocks (KV-load failure),
    whatever their ref counts.  vLLM takes a ``set`` and walks it in set order, which fixes the
    order of the ``BlockRemoved`` events; the spec walks the same set."""
    return with_pool(state, block_pool.evict_blocks(state.pool, set(block_ids)))


def reset_prefix_cache(state: KVCacheManagerState) -> tuple[KVCacheManagerState, bool]:
    """vLLM 0.33 ``KVCacheManager.reset_prefix_cache``: refused while any block is in use."""
    pool, ok = block_pool.reset_prefix_cache(state.pool)
    return with_pool(state, pool), ok


def take_events(state: KVCacheManagerState) -> tuple[KVCacheManagerState, tuple[Event, ...]]:
    """vLLM 0.33 ``KVCacheManager.take_events``."""
    pool, events = block_pool.take_events(state.pool)
    return with_pool(state, pool), events
