"""Single-type managers: one KV-cache group's tables, by attention kind.

Models vLLM 0.33.0 ``vllm/v1/core/single_type_kv_cache_manager.py``: the base
``SingleTypeKVCacheManager`` and ``FullAttentionManager``, ``SlidingWindowManager``,
``ChunkedLocalAttentionManager``, ``CrossAttentionManager`` (core scope: no EAGLE drop, no DCP,
no partial hits / CoW, no retention intervals).  vLLM dispatches on the manager class; the spec
dispatches on ``AttentionSpec.kind``.  Every function takes the whole state and a group id and
returns a new state.

The hit searches (``find_longest_cache_hit_*``) are pure functions of a lookup ``cached_at(i)``
(the blocks cached under the request's i-th hash, one per group id, or None), so the proofs can
run them on any pattern of cached blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvspec.spec import arith, block_pool
from kvspec.spec.block_pool import free_blocks, get_new_blocks
from kvspec.spec.config import AttentionSpec
from kvspec.spec.hashing import get_group_block_hashes
from kvspec.spec.releases.profile import BASE, PartialTailBoundary, Profile
from kvspec.spec.request import Request
from kvspec.spec.state import (
    KVCacheManagerState,
    get_table,
    with_num_cached_block,
    with_pool,
    with_table,
    without_request,
)
from kvspec.spec.types import NULL_BLOCK_ID, BlockHash, BlockId, GroupBlockIds, GroupId, RequestId

CachedAt = Callable[[int], Sequence[BlockId] | None]
"""``cached_at(i)``: the block cached under view hash i for each group id searched, or None."""

HitResult = tuple[GroupBlockIds, int]  # (hit blocks per group, hit length in tokens)
"""Per searched group id, the hit blocks (null placeholders included); and the hit length in tokens."""


# --- per-kind arithmetic ---------------------------------------------------------------------------


def get_num_skipped_tokens(spec: AttentionSpec, num_computed_tokens: int) -> int:
    """vLLM 0.33 ``get_num_skipped_tokens``: tokens no future query of this group attends to."""
    if spec.kind == "sliding_window":
        assert spec.sliding_window is not None
        return arith.get_sliding_window_num_skipped_tokens(num_computed_tokens, spec.sliding_window)
    if spec.kind == "chunked_local":
        assert spec.attention_chunk_size is not None
        return arith.get_chunked_local_num_skipped_tokens(num_computed_tokens, spec.attention_chunk_size)
    return 0  # full and cross attention keep everything


def get_max_admission_blocks(spec: AttentionSpec, max_in_flight_tokens: int, max_model_len: int) -> int | None:
    """vLLM 0.33 ``max_admission_blocks_per_request``: set only for the recycling kinds."""
    if spec.kind == "sliding_window":
        assert spec.sliding_window is not None
        return arith.get_sliding_window_admission_cap(
            spec.sliding_window, max_in_flight_tokens, max_model_len, spec.block_size
        )
    if spec.kind == "chunked_local":
        assert spec.attention_chunk_size is not None
        return arith.get_chunked_local_admission_cap(
            spec.attention_chunk_size, max_in_flight_tokens, max_model_len, spec.block_size
        )
    return None


def resolve_block_hashes(
    block_hashes: Sequence[BlockHash], hash_block_size: int, block_size: int, profile: Profile = BASE
) -> Sequence[BlockHash]:
    """vLLM 0.33 ``resolve_block_hashes`` / ``BlockHashListWithBlockSize``: a group whose block is
    ``s`` hash blocks wide sees, for its block j, the fine hash ``(j+1)*s - 1``; hashes chain, so
    that one fingerprints the whole prefix (before 0.24: ``spec.hashing.get_group_block_hashes``)."""
    return get_group_block_hashes(block_hashes, hash_block_size, block_size, profile)


# --- prefix-cache hit searches ---------------------------------------------------------------------


def find_longest_cache_hit_full(
    cached_at: CachedAt, num_groups: int, max_length: int, block_size: int, alignment: int
) -> HitResult:
    """vLLM 0.33 ``FullAttentionManager.find_longest_cache_hit``: walk the first
    ``max_length // bs`` blocks left to right and stop at the first miss (hashes chain, so nothing
    after a miss can hit); round the hit down to ``alignment``; trim the lists to it."""
    hits: list[list[BlockId]] = [[] for _ in range(num_groups)]
    for i in range(arith.floordiv(max_length, block_size)):
        found = cached_at(i)
        if found is None:
            break
        for lst, b in zip(hits, found):
            lst.append(b)
    hit_length = len(hits[0]) * block_size if hits else 0
    hit_length = arith.align_down(hit_length, alignment)
    num_blocks = arith.cdiv(hit_length, block_size)
    return tuple(tuple(lst[:num_blocks]) for lst in hits), hit_length


def find_longest_cache_hit_sliding_window(
    cached_at: CachedAt, num_groups: int, max_length: int, block_size: int, alignment: int, sliding_window: int
) -> HitResult:
    """vLLM 0.33 ``SlidingWindowManager.find_longest_cache_hit``.

    Scan right to left for ``need = cdiv(W - 1, bs)`` contiguous cached blocks; the first run found
    ends the hit, with null placeholders before it.  When no such run exists, the contiguous run
    starting at block 0 is a hit (its window reaches the sequence start), cut back to alignment.
    When ``bs != alignment`` a run may only start (at its right end) on an aligned boundary.
    """
    need = arith.get_sliding_window_blocks_for_hit(sliding_window, block_size)
    max_num_blocks = arith.floordiv(max_length, block_size)
    hits: list[list[BlockId]] = [[NULL_BLOCK_ID] * max_num_blocks for _ in range(num_groups)]
    run = 0
    match_found = False
    for i in range(max_num_blocks - 1, -1, -1):
        found = cached_at(i)
        if found is None:
            run = 0
            continue
        if run == 0 and block_size != alignment and ((i + 1) * block_size) % alignment != 0:
            continue  # a run must end on an aligned boundary
        for lst, b in zip(hits, found):
            lst[i] = b
        run += 1
        if run >= need:
            for lst in hits:
                del lst[i + run :]
            match_found = True
            break
    if not match_found:
        for lst in hits:
            del lst[run:]
        while block_size != alignment and hits and (len(hits[0]) * block_size) % alignment != 0:
            for lst in hits:
                lst.pop()
    hit_length = len(hits[0]) * block_size if hits else 0
    return tuple(tuple(lst) for lst in hits), hit_length


def find_longest_cache_hit_chunked_local(
    cached_at: CachedAt, num_groups: int, max_length: int, block_size: int, alignment: int, attention_chunk_size: int
) -> HitResult:
    """vLLM 0.33 ``ChunkedLocalAttentionManager.find_longest_cache_hit``: every block before the
    chunk holding position ``max_length`` counts as hit (as nulls, nothing touched); from there,
    left to right until the first miss."""
    assert block_size == alignment, "chunked local attention needs block_size == the hit alignment"
    max_num_blocks = arith.floordiv(max_length, block_size)
    start = arith.get_chunked_local_hit_start(max_length, attention_chunk_size) if max_length > 0 else 0
    start_block = arith.floordiv(start, block_size)
    hits: list[list[BlockId]] = [[NULL_BLOCK_ID] * start_block for _ in range(num_groups)]
    for i in range(start_block, max_num_blocks):
        found = cached_at(i)
        if found is None:
            break
        for lst, b in zip(hits, found):
            lst.append(b)
    hit_length = len(hits[0]) * block_size if hits else 0
    return tuple(tuple(lst) for lst in hits), hit_length


def find_longest_cache_hit(
    state: KVCacheManagerState,
    spec: AttentionSpec,
    group_ids: Sequence[GroupId],
    block_hashes: Sequence[BlockHash],
    max_length: int,
    alignment: int,
) -> HitResult:
    """Dispatch on the group kind, with the pool as the lookup (``BlockPool.get_cached_block``:
    every group id must hit, each taking its oldest block under the key)."""
    view = resolve_block_hashes(block_hashes, state.config.hash_block_size, spec.block_size, state.config.profile)

    def cached_at(i: int) -> Sequence[BlockId] | None:
        return block_pool.get_cached_block(state.pool, view[i], group_ids) if i < len(view) else None

    n = len(group_ids)
    if spec.kind == "full":
        return find_longest_cache_hit_full(cached_at, n, max_length, spec.block_size, alignment)
    if spec.kind == "sliding_window":
        assert spec.sliding_window is not None
        return find_longest_cache_hit_sliding_window(
            cached_at, n, max_length, spec.block_size, alignment, spec.sliding_window
        )
    if spec.kind == "chunked_local":
        assert spec.attention_chunk_size is not None
        return find_longest_cache_hit_chunked_local(
            cached_at, n, max_length, spec.block_size, alignment, spec.attention_chunk_size
        )
    raise AssertionError("cross-attention groups are never searched (they cannot be cached)")


# --- admission prediction ----------------------------------------------------------------------------


def get_num_blocks_to_allocate(
    state: KVCacheManagerState,
    gid: GroupId,
    request_id: RequestId,
    num_tokens: int,
    new_computed_blocks: Sequence[BlockId],
    total_computed_tokens: int,
    apply_admission_cap: bool = False,
) -> int:
    """vLLM 0.33 ``SingleTypeKVCacheManager.get_num_blocks_to_allocate`` (no CoW block).

    Fresh blocks the table still needs, plus hits at ``ref_cnt == 0``: touching takes those off
    the free queue, so they consume free capacity too.
    """
    spec = state.config.groups[gid]
    required = arith.get_num_required_blocks(num_tokens, spec.block_size)
    if apply_admission_cap:
        in_flight = state.config.max_in_flight_tokens
        cap = get_max_admission_blocks(
            spec, state.config.max_model_len if in_flight is None else in_flight, state.config.max_model_len
        )
        if cap is not None:
            required = min(required, cap)
    held = len(get_table(state, gid, request_id))
    if request_id in state.groups[gid].num_cached_block:
        # Running request: no new hits; rejected drafts may leave the table longer than needed.
        assert not new_computed_blocks, "a running request cannot adopt new prefix hits"
        return arith.get_num_new_blocks_running(required, held)
    skipped_blocks = arith.get_num_skipped_blocks(get_num_skipped_tokens(spec, total_computed_tokens), spec.block_size)
    local_blocks = len(new_computed_blocks) + held
    kept_hits = new_computed_blocks[max(0, skipped_blocks - held) :]
    evictable = sum(1 for b in kept_hits if b != NULL_BLOCK_ID and state.pool.ref_cnt[b] == 0)
    return arith.get_num_new_blocks_admission(required, skipped_blocks, local_blocks, evictable)


# --- adopting hits and allocating --------------------------------------------------------------------


def add_local_computed_blocks(
    state: KVCacheManagerState,
    gid: GroupId,
    request_id: RequestId,
    new_computed_blocks: Sequence[BlockId],
    num_local_computed_tokens: int,
    num_external_computed_tokens: int,
) -> KVCacheManagerState:
    """vLLM 0.33 ``add_local_computed_blocks`` (first admission only): hits that fell out of the
    window (counting the external tokens) become nulls and stay untouched, hence evictable; the
    rest are touched; every adopted position counts as already cached."""
    spec = state.config.groups[gid]
    if spec.kind == "cross":
        assert not new_computed_blocks, "cross-attention never has prefix hits"
        return state
    assert not get_table(state, gid, request_id), "hits are only adopted by a request that holds no blocks"
    total = num_local_computed_tokens + num_external_computed_tokens
    skipped_blocks = arith.get_num_skipped_blocks(get_num_skipped_tokens(spec, total), spec.block_size)
    kept = tuple(new_computed_blocks[skipped_blocks:])
    if state.config.enable_caching:
        state = with_pool(state, block_pool.touch(state.pool, kept))
    else:
        assert all(b == NULL_BLOCK_ID for b in kept), "prefix hits while caching is disabled"
    table = (NULL_BLOCK_ID,) * skipped_blocks + kept
    state = with_table(state, gid, request_id, table)
    return with_num_cached_block(state, gid, request_id, len(table))


def allocate_external_computed_blocks(
    state: KVCacheManagerState,
    gid: GroupId,
    request_id: RequestId,
    num_local_computed_tokens: int,
    num_external_computed_tokens: int,
) -> KVCacheManagerState:
    """vLLM 0.33 ``allocate_external_computed_blocks``: fresh, unhashed blocks for the tokens a
    KV connector will write; external tokens already out of the window need none."""
    spec = state.config.groups[gid]
    if spec.kind == "cross":
        return state
    total = num_local_computed_tokens + num_external_computed_tokens
    skipped = get_num_skipped_tokens(spec, total)
    ext = num_external_computed_tokens
    if arith.is_external_skip_clamped(state.config.profile.external_skip_clamp, skipped, spec.block_size):
        ext = arith.get_num_external_tokens_after_skip(total, skipped, ext)
    if ext <= 0:
        return state
    table = get_table(state, gid, request_id)
    n = arith.get_num_external_blocks_to_allocate(total, spec.block_size, len(table))
    pool, fresh = get_new_blocks(state.pool, n)
    return with_table(with_pool(state, pool), gid, request_id, table + fresh)


def allocate_new_blocks(
    state: KVCacheManagerState, gid: GroupId, request_id: RequestId, num_tokens: int
) -> tuple[KVCacheManagerState, tuple[BlockId, ...]]:
    """vLLM 0.33 ``allocate_new_blocks``: grow the table to ``cdiv(num_tokens, bs)`` blocks (it
    never shrinks); return only the fresh blocks.  Like vLLM's defaultdict, the table entry exists
    afterwards even when nothing was needed."""
    spec = state.config.groups[gid]
    table = get_table(state, gid, request_id)
    n = arith.get_num_new_blocks_to_allocate(num_tokens, spec.block_size, len(table))
    if n <= 0:
        if request_id not in state.groups[gid].req_to_blocks:
            state = with_table(state, gid, request_id, table)
        return state, ()
    pool, fresh = get_new_blocks(state.pool, n)
    return with_table(with_pool(state, pool), gid, request_id, table + fresh), fresh


# --- caching ---------------------------------------------------------------------------------------


def get_reachable_block_mask(
    spec: AttentionSpec, start_block: int, end_block: int, alignment: int
) -> tuple[bool, ...] | None:
    """vLLM 0.33 ``SlidingWindowManager.reachable_block_mask`` (dense retention, no EAGLE): with
    hits aligned to ``alignment`` tokens, only the last ``need`` blocks of each aligned segment can
    ever serve a hit, so only they are cached.  None (cache all) for other kinds, when the segment
    is not a whole number of blocks, or when ``need`` covers the segment."""
    if spec.kind != "sliding_window":
        return None
    assert spec.sliding_window is not None
    if alignment % spec.block_size != 0:
        return None
    need = arith.get_sliding_window_blocks_for_hit(spec.sliding_window, spec.block_size)
    per_segment = alignment // spec.block_size
    if need >= per_segment:
        return None
    return tuple(i % per_segment >= per_segment - need for i in range(start_block, end_block))


def cache_blocks(
    state: KVCacheManagerState, gid: GroupId, request: Request, num_tokens: int, alignment: int
) -> KVCacheManagerState:
    """vLLM 0.33 ``SingleTypeKVCacheManager.cache_blocks``: publish the newly full blocks (only as
    far as hashes exist) and record how many table positions are now cached.  Nothing is written
    when nothing new is full (so a request with no full block stays out of ``num_cached_block``).
    A full-attention group wider than the hash block then also publishes the prompt's tail
    boundary (``FullAttentionManager.cache_blocks``), even when nothing new was full."""
    spec = state.config.groups[gid]
    assert spec.kind != "cross", "cross-attention blocks cannot be cached"
    state = _cache_full_blocks(state, gid, request, num_tokens, alignment)
    if spec.kind == "full" and spec.block_size != state.config.hash_block_size:
        state = cache_partial_tail_block(state, gid, request, num_tokens)
    return state


def _cache_full_blocks(
    state: KVCacheManagerState, gid: GroupId, request: Request, num_tokens: int, alignment: int
) -> KVCacheManagerState:
    spec = state.config.groups[gid]
    rid = request.request_id
    num_cached = state.groups[gid].num_cached_block.get(rid, 0)
    num_full = arith.get_num_full_blocks_to_cache(
        num_tokens, len(request.block_hashes), state.config.hash_block_size, spec.block_size
    )
    if state.config.profile.cache_past_hashes == "raise":
        verify_hashes_cover(num_cached, arith.floordiv(num_tokens, spec.block_size), num_full)
    if num_cached >= num_full:
        return state
    table = get_table(state, gid, rid)
    view = resolve_block_hashes(
        request.block_hashes, state.config.hash_block_size, spec.block_size, state.config.profile
    )
    mask = get_reachable_block_mask(spec, num_cached, num_full, alignment)
    pool = block_pool.cache_full_blocks(
        state.pool, request.all_token_ids, view, table, num_cached, num_full, spec.block_size, gid, mask
    )
    return with_num_cached_block(with_pool(state, pool), gid, rid, num_full)


def verify_hashes_cover(num_cached: int, num_full: int, num_hashed: int) -> None:
    """Before vLLM 0.33 (``Profile.cache_past_hashes == "raise"``, Change
    ``cache_full_blocks_capped_by_hashes``) ``cache_blocks`` did not stop at the hashed blocks:
    asking for a new full block past them failed in ``BlockPool.cache_full_blocks`` (the scheduler
    never asks it; the spec refuses the call the same way)."""
    if num_cached < num_full and num_full > num_hashed:
        raise IndexError(f"cache_blocks: {num_full} full blocks asked, hashes cover {num_hashed} (vLLM < 0.33)")


def get_partial_tail_boundary(request: Request, hash_block_size: int, rule: PartialTailBoundary) -> int:
    """vLLM 0.33 ``FullAttentionManager._cache_partial_tail_block``: the last hash boundary a
    resend of this prompt could hit, ``num_prompt_tokens - 1`` rounded down to hash blocks.

    ``rule`` is the release's ``Profile.partial_tail_boundary``: vLLM 0.26 to 0.31 round
    ``num_prompt_tokens`` itself down (Change ``full_attention_partial_tail_entry``; 0.32 Change
    ``partial_tail_boundary_prompt_minus_one``); before 0.26 there is no partial entry (0)."""
    if rule == "none":
        return 0
    limit = request.num_prompt_tokens - 1 if rule == "prompt_minus_one" else request.num_prompt_tokens
    return min(arith.floordiv(limit, hash_block_size), len(request.block_hashes)) * hash_block_size


def cache_partial_tail_block(
    state: KVCacheManagerState, gid: GroupId, request: Request, num_tokens: int
) -> KVCacheManagerState:
    """vLLM 0.33 ``_cache_partial_tail_block``: when that boundary is computed and falls strictly
    inside a block of this group, publish it as a partial entry of that block."""
    spec = state.config.groups[gid]
    hbs = state.config.hash_block_size
    boundary = get_partial_tail_boundary(request, hbs, state.config.profile.partial_tail_boundary)
    if boundary == 0 or boundary > num_tokens or boundary % spec.block_size == 0:
        return state
    table = get_table(state, gid, request.request_id)
    index = boundary // spec.block_size
    if index >= len(table):
        return state
    pool = block_pool.cache_partial_block(
        state.pool, request.all_token_ids, request.block_hashes, table[index], boundary, hbs, gid
    )
    return with_pool(state, pool)


# --- releasing -----------------------------------------------------------------------------------------


def free(state: KVCacheManagerState, gid: GroupId, request_id: RequestId) -> KVCacheManagerState:
    """vLLM 0.33 ``SingleTypeKVCacheManager.free``: forget the request, drop the leading null run,
    and free the rest tail first, so a request's last block is evicted first and block 0 last."""
    table = get_table(state, gid, request_id)
    state = without_request(state, gid, request_id)
    start = 0
    while start < len(table) and table[start] == NULL_BLOCK_ID:
        start += 1
    split = block_pool.finish_free_splits(state.config.profile, state.config.groups[gid].kind)
    return with_pool(state, free_blocks(state.pool, reversed(table[start:]), split))


def remove_skipped_blocks(
    state: KVCacheManagerState, gid: GroupId, request_id: RequestId, num_computed_tokens: int
) -> KVCacheManagerState:
    """vLLM 0.33 ``SingleTypeKVCacheManager.remove_skipped_blocks``: replace every block wholly out
    of the attention span by the null block and free it.  The walk goes backward from the last
    skipped block and stops at the first null (everything before it is null already); blocks are
    freed in that descending order.  An unknown request gets an empty table entry (vLLM's
    defaultdict)."""
    spec = state.config.groups[gid]
    skipped = get_num_skipped_tokens(spec, num_computed_tokens)
    if skipped <= 0:
        return state
    table = get_table(state, gid, request_id)
    if request_id not in state.groups[gid].req_to_blocks:
        state = with_table(state, gid, request_id, table)
    k = arith.get_num_blocks_to_remove(skipped, spec.block_size, len(table))
    removed: list[BlockId] = []
    new_table = list(table)
    for i in range(k - 1, -1, -1):
        if new_table[i] == NULL_BLOCK_ID:
            break
        removed.append(new_table[i])
        new_table[i] = NULL_BLOCK_ID
    if not removed:
        return state
    state = with_table(state, gid, request_id, tuple(new_table))
    return with_pool(state, free_blocks(state.pool, removed))
