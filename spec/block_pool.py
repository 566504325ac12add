"""The block pool: ref counts, the free queue, the hash -> blocks map, events.

Models vLLM 0.33.0 ``vllm/v1/core/block_pool.py`` (``BlockPool``, ``FreeKVCacheBlockQueue``,
``BlockHashToBlockMap``) for the core scope: no partial (sub-block) hashes, no secondary keys, no
host tiers, no reuse watchers.  The pool is a value: each operation returns a new pool.

Representation (measured: tuples rebuilt per operation cost less than the invariant checks that
follow every step, for pools of the sizes the harness uses):
- ``ref_cnt[b]``, ``block_key[b]``: per block id; the null block (id 0) keeps ``ref_cnt == 0`` and
  no key, since vLLM 0.33 skips it in ``touch`` and ``free_blocks``.
- ``free_queue``: block ids from the front (handed out and evicted first) to the tail.
- ``cached``: map key -> block ids stored under it, oldest first; vLLM's ``get_one_block`` returns
  the oldest, and there is no dedup (two blocks may hold the same key).
- ``events``: queued ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` (only when enabled).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from spec.config import Profile
from spec.events import AllBlocksCleared, BlockRemoved, BlockStored, Event
from spec.types import (
    NULL_BLOCK_ID,
    BlockCount,
    BlockHash,
    BlockId,
    BlockKey,
    GroupId,
    TokenCount,
    get_block_hash,
    get_group_id,
    make_block_key,
)


@dataclass(frozen=True, slots=True)
class BlockPool:
    num_blocks: BlockCount  # vLLM num_gpu_blocks, the null block included
    enable_caching: bool
    profile: Profile
    enable_kv_cache_events: bool
    ref_cnt: tuple[int, ...]
    block_key: tuple[BlockKey | None, ...]
    free_queue: tuple[BlockId, ...]
    cached: Mapping[BlockKey, tuple[BlockId, ...]]
    events: tuple[Event, ...]


def init_block_pool(
    num_blocks: int, enable_caching: bool, profile: Profile = Profile.V0_33, enable_kv_cache_events: bool = False
) -> BlockPool:
    """vLLM 0.33 ``BlockPool.__init__``: blocks ``0..N-1`` queued in ascending order, then the head
    (block 0) is popped to serve as the null block, so ``N - 1`` blocks are free."""
    assert num_blocks >= 1, "the pool needs at least the null block"
    return BlockPool(
        num_blocks=BlockCount(num_blocks),
        enable_caching=enable_caching,
        profile=profile,
        enable_kv_cache_events=enable_kv_cache_events,
        ref_cnt=(0,) * num_blocks,
        block_key=(None,) * num_blocks,
        free_queue=tuple(BlockId(b) for b in range(1, num_blocks)),
        cached={},
        events=(),
    )


# --- accessors ---------------------------------------------------------------------------------


def get_num_free_blocks(pool: BlockPool) -> BlockCount:
    """vLLM 0.33 ``get_num_free_blocks``: the queue length; cached-but-evictable blocks count."""
    return BlockCount(len(pool.free_queue))


def get_usage(pool: BlockPool) -> float:
    """vLLM 0.33 ``get_usage``: ``1 - free / (N - 1)``; the null block is excluded."""
    usable = pool.num_blocks - 1
    return 0.0 if usable == 0 else 1.0 - len(pool.free_queue) / usable


def get_cached_block(
    pool: BlockPool, block_hash: BlockHash, group_ids: Sequence[GroupId]
) -> tuple[BlockId, ...] | None:
    """vLLM 0.33 ``BlockPool.get_cached_block``: for each group, the oldest block stored under
    ``hash ++ group id``; None if any group misses."""
    found = []
    for gid in group_ids:
        blocks = pool.cached.get(make_block_key(block_hash, gid))
        if not blocks:
            return None
        found.append(blocks[0])
    return tuple(found)


def is_block_hashed(pool: BlockPool, block_id: BlockId) -> bool:
    return pool.block_key[block_id] is not None


# --- operations ----------------------------------------------------------------------------------


def touch(pool: BlockPool, blocks: Iterable[BlockId]) -> BlockPool:
    """vLLM 0.33 ``BlockPool.touch``: a prefix hit takes a reference; a block at ``ref_cnt == 0``
    leaves the free queue (from wherever it sits: lazy eviction keeps freed cached blocks hittable).
    The null block is skipped."""
    ref = list(pool.ref_cnt)
    leaving: set[BlockId] = set()
    for b in blocks:
        if b == NULL_BLOCK_ID:
            continue
        if ref[b] == 0:
            assert b not in leaving, f"block {b} touched twice while free"
            leaving.add(b)
        ref[b] += 1
    queue = tuple(b for b in pool.free_queue if b not in leaving) if leaving else pool.free_queue
    assert len(queue) == len(pool.free_queue) - len(leaving), "a block with ref_cnt 0 was not in the free queue"
    return replace(pool, ref_cnt=tuple(ref), free_queue=queue)


def get_new_blocks(pool: BlockPool, num_blocks: int) -> tuple[BlockPool, tuple[BlockId, ...]]:
    """vLLM 0.33 ``BlockPool.get_new_blocks``: pop ``n`` blocks from the front; evict any hash they
    still carry (``BlockRemoved`` per key); each gets ``ref_cnt = 1``.

    Asking for more than the free count is a bug in the caller's prediction (vLLM raises
    ``ValueError``); ``allocate_slots`` checks capacity first, so the spec never does.
    """
    assert num_blocks >= 0, f"negative block count {num_blocks}"
    if num_blocks > len(pool.free_queue):
        raise ValueError(f"Cannot get {num_blocks} free blocks from the pool ({len(pool.free_queue)} free)")
    taken = pool.free_queue[:num_blocks]
    if pool.enable_caching:
        for b in taken:
            pool = _maybe_evict_cached_block(pool, b)
    ref = list(pool.ref_cnt)
    for b in taken:
        assert ref[b] == 0, f"block {b} in the free queue has ref_cnt {ref[b]}"
        ref[b] = 1
    return replace(pool, ref_cnt=tuple(ref), free_queue=pool.free_queue[num_blocks:]), taken


def free_blocks(pool: BlockPool, ordered_blocks: Iterable[BlockId]) -> BlockPool:
    """vLLM 0.33 ``BlockPool.free_blocks``; ``ordered_blocks`` come first-to-evict first.

    Each non-null block drops one reference.  Blocks reaching 0 rejoin the queue: in 0.33, unhashed
    ones (or all, with caching off) are prepended in the given order (LIFO reuse), hashed ones are
    appended (LRU eviction); in the 0.20 profile all of them are appended.  Hashes are kept.
    """
    ref = list(pool.ref_cnt)
    to_front: list[BlockId] = []
    to_tail: list[BlockId] = []
    for b in ordered_blocks:
        if b == NULL_BLOCK_ID:
            continue
        assert ref[b] > 0, f"block {b} freed with ref_cnt {ref[b]}"
        ref[b] -= 1
        if ref[b] == 0:
            unhashed = pool.block_key[b] is None or not pool.enable_caching
            if unhashed and pool.profile is Profile.V0_33:
                to_front.append(b)
            else:
                to_tail.append(b)
    return replace(pool, ref_cnt=tuple(ref), free_queue=tuple(to_front) + pool.free_queue + tuple(to_tail))


def cache_full_blocks(
    pool: BlockPool,
    all_token_ids: Sequence[int],
    block_hashes: Sequence[BlockHash],
    blocks: Sequence[BlockId],
    num_cached_blocks: int,
    num_full_blocks: int,
    block_size: int,
    group_id: GroupId,
    block_mask: Sequence[bool] | None = None,
) -> BlockPool:
    """vLLM 0.33 ``BlockPool.cache_full_blocks``.

    Publish ``blocks[num_cached_blocks:num_full_blocks]`` under ``block_hashes[i] ++ group_id``;
    ``block_hashes`` is the request's hash list already viewed at ``block_size``.  Null blocks and
    blocks whose ``block_mask`` entry (aligned with the new range) is False are skipped.  One
    ``BlockStored`` covers the whole token range, even when every block was skipped.
    """
    if num_cached_blocks >= num_full_blocks:
        return pool
    assert len(block_hashes) >= num_full_blocks, "caching a block whose hash does not exist yet"
    assert len(blocks) >= num_full_blocks, "caching past the end of the block table"
    keys = list(pool.block_key)
    cached = dict(pool.cached)
    stored: list[BlockHash] = []
    assert block_mask is None or len(block_mask) == num_full_blocks - num_cached_blocks
    for i in range(num_cached_blocks, num_full_blocks):
        b = blocks[i]
        if b == NULL_BLOCK_ID or (block_mask is not None and not block_mask[i - num_cached_blocks]):
            continue
        # Only partial->full promotion (out of scope) may find a hash already set.
        assert keys[b] is None, f"block {b} is already hashed"
        key = make_block_key(block_hashes[i], group_id)
        keys[b] = key
        cached[key] = cached.get(key, ()) + (b,)
        stored.append(block_hashes[i])
    events = pool.events
    if pool.enable_kv_cache_events:
        parent = block_hashes[num_cached_blocks - 1] if num_cached_blocks > 0 else None
        events += (
            BlockStored(
                block_hashes=tuple(stored),
                parent_block_hash=parent,
                token_ids=tuple(all_token_ids[num_cached_blocks * block_size : num_full_blocks * block_size]),
                block_size=TokenCount(block_size),
                group_id=group_id,
            ),
        )
    return replace(pool, block_key=tuple(keys), cached=cached, events=events)


def _maybe_evict_cached_block(pool: BlockPool, block_id: BlockId) -> BlockPool:
    """vLLM 0.33 ``BlockPool._maybe_evict_cached_block``: drop the block's key from the map (only
    this block: other blocks under the same key stay), reset its hash, one ``BlockRemoved``."""
    key = pool.block_key[block_id]
    if key is None:
        return pool
    cached = dict(pool.cached)
    holders = cached.get(key, ())
    removed = block_id in holders
    if removed:
        rest = tuple(b for b in holders if b != block_id)
        if rest:
            cached[key] = rest
        else:
            del cached[key]
    keys = list(pool.block_key)
    keys[block_id] = None
    events = pool.events
    if removed and pool.enable_kv_cache_events:
        events += (BlockRemoved(block_hashes=(get_block_hash(key),), group_id=get_group_id(key)),)
    return replace(pool, block_key=tuple(keys), cached=cached, events=events)


def evict_blocks(pool: BlockPool, block_ids: Iterable[int]) -> BlockPool:
    """vLLM 0.33 ``BlockPool.evict_blocks``: remove the hashes of the given blocks whatever their
    ref count; ref counts and the free queue are untouched (used after KV-load failures)."""
    for b in block_ids:
        assert 0 <= b < pool.num_blocks, f"invalid block id {b} (pool has {pool.num_blocks} blocks)"
        pool = _maybe_evict_cached_block(pool, BlockId(b))
    return pool


def reset_prefix_cache(pool: BlockPool) -> tuple[BlockPool, bool]:
    """vLLM 0.33 ``BlockPool.reset_prefix_cache``: refuse (False, no change) unless every usable
    block is free; otherwise forget every hash, keep the queue order, emit ``AllBlocksCleared``."""
    if pool.num_blocks - len(pool.free_queue) != 1:  # the null block always counts as used
        return pool, False
    events = pool.events + ((AllBlocksCleared(),) if pool.enable_kv_cache_events else ())
    return replace(pool, block_key=(None,) * pool.num_blocks, cached={}, events=events), True


def take_events(pool: BlockPool) -> tuple[BlockPool, tuple[Event, ...]]:
    """vLLM 0.33 ``BlockPool.take_events``: drain the queue (empty when events are disabled)."""
    return replace(pool, events=()), pool.events
