"""The block pool: ref counts, the free queue, the hash -> blocks map, events.

Models vLLM 0.33.0 ``vllm/v1/core/block_pool.py`` (``BlockPool``, ``BlockHashToBlockMap``) and the
free queue of ``vllm/v1/core/kv_cache_utils.py`` (``FreeKVCacheBlockQueue``) for the core scope:
no copy-on-write, no host tiers, no reuse watchers.
The pool is a value: each operation returns a new pool.

Partial entries are in scope because vLLM 0.33 creates them without any partial-hit feature being
on: a full-attention group whose block is wider than the hash block also publishes the prompt's
last hash boundary when it falls inside a block (``cache_partial_block``).  Such a key is the
block's primary key if it had none, else a secondary key; it is dropped when the block is promoted
to its full key, evicted or reset.

Representation (``spec.persistent``, ``spec.linked_queue``): up to ``SMALL_POOL`` blocks, tuples and dicts rebuilt per
operation (cheapest at that size); above, persistent containers that share what an operation
leaves alone, so a step costs the same at 1,024 and 65,536 blocks.  Both read alike:
- ``ref_cnt[b]``, ``block_key[b]``, ``block_key_tokens[b]``: per block id, the ref count, the
  primary key and how many prefix tokens it covers; the null block (id 0) keeps ``ref_cnt == 0``
  and no key, since vLLM 0.33 skips it in ``touch`` and ``free_blocks``.
- ``secondary_keys[b]``: further keys stored for block b (vLLM ``cached_block_hashes_by_block``).
- ``free_queue``: block ids from the front (handed out and evicted first) to the tail; for large
  pools a ``LinkedQueue``, linked through the blocks as vLLM's ``FreeKVCacheBlockQueue`` is.
- ``cached``: map key -> block ids stored under it, oldest first; vLLM's ``get_one_block`` returns
  the oldest, and there is no dedup (two blocks may hold the same key).
- ``events``: queued ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` (only when enabled).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from kvspec.spec.events import AllBlocksCleared, BlockRemoved, BlockStored, Event
from kvspec.spec.hashing import get_published_hash
from kvspec.spec.linked_queue import LinkedQueue, queue_popleft, queue_push, queue_remove
from kvspec.spec.persistent import SMALL_POOL, MapOverlay, PMap, PVec, VecOverlay, vec_set
from kvspec.spec.releases.profile import BASE, Profile
from kvspec.spec.types import (
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
    ref_cnt: Sequence[int]
    block_key: Sequence[BlockKey | None]
    block_key_tokens: Sequence[int | None]
    secondary_keys: Mapping[BlockId, tuple[BlockKey, ...]]
    free_queue: Sequence[BlockId]
    cached: Mapping[BlockKey, tuple[BlockId, ...]]
    events: tuple[Event, ...]


def init_block_pool(
    num_blocks: int,
    enable_caching: bool,
    profile: Profile = BASE,
    enable_kv_cache_events: bool = False,
    persistent: bool | None = None,
) -> BlockPool:
    """vLLM 0.33 ``BlockPool.__init__``: blocks ``0..N-1`` queued in ascending order, then the head
    (block 0) is popped to serve as the null block, so ``N - 1`` blocks are free.

    ``persistent`` chooses the representation (``spec.persistent``); None: persistent containers
    above ``SMALL_POOL`` blocks.  Both behave alike, block for block."""
    assert num_blocks >= 1, "the pool needs at least the null block"
    if persistent is None:
        persistent = num_blocks > SMALL_POOL
    free = range(1, num_blocks)
    queue: Any = LinkedQueue.of(free, num_blocks) if persistent else tuple(BlockId(b) for b in free)
    keys, key_tokens, secondary, cached = _no_hashes(num_blocks, persistent)
    return BlockPool(
        num_blocks=BlockCount(num_blocks),
        enable_caching=enable_caching,
        profile=profile,
        enable_kv_cache_events=enable_kv_cache_events,
        ref_cnt=PVec.filled(0, num_blocks) if persistent else (0,) * num_blocks,
        block_key=keys,
        block_key_tokens=key_tokens,
        secondary_keys=secondary,
        free_queue=queue,
        cached=cached,
        events=(),
    )


def _no_hashes(num_blocks: int, persistent: bool) -> tuple[Any, Any, Any, Any]:
    """Empty hash fields (keys, key token counts, secondary keys, map) of either representation."""
    if persistent:
        nothing = PVec.filled(None, num_blocks)
        return nothing, nothing, PMap.empty(num_blocks), PMap.empty(num_blocks)
    return (None,) * num_blocks, (None,) * num_blocks, {}, {}


def is_persistent(pool: BlockPool) -> bool:
    """Whether the pool uses the persistent containers (``spec.persistent``)."""
    return isinstance(pool.ref_cnt, PVec)


def thaw(pool: BlockPool) -> BlockPool:
    """The same pool in tuples and dicts: for predicates that read every block (full checks), where
    one conversion in C beats a container access per block."""
    if not is_persistent(pool):
        return pool
    cached, secondary = pool.cached, pool.secondary_keys
    return replace(
        pool,
        ref_cnt=tuple(pool.ref_cnt),
        block_key=tuple(pool.block_key),
        block_key_tokens=tuple(pool.block_key_tokens),
        secondary_keys=secondary.to_dict() if isinstance(secondary, PMap) else dict(secondary),
        free_queue=tuple(pool.free_queue),
        cached=cached.to_dict() if isinstance(cached, PMap) else dict(cached),
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
    ref: dict[int, int] = {}
    leaving: set[BlockId] = set()
    for b in blocks:
        if b == NULL_BLOCK_ID:
            continue
        count = ref[b] if b in ref else pool.ref_cnt[b]
        if count == 0:
            assert b not in leaving, f"block {b} touched twice while free"
            leaving.add(b)
        ref[b] = count + 1
    queue = queue_remove(pool.free_queue, leaving)  # type: ignore[arg-type]
    assert len(queue) == len(pool.free_queue) - len(leaving), "a block with ref_cnt 0 was not in the free queue"
    return replace(pool, ref_cnt=vec_set(pool.ref_cnt, ref), free_queue=queue)


def get_new_blocks(pool: BlockPool, num_blocks: int) -> tuple[BlockPool, tuple[BlockId, ...]]:
    """vLLM 0.33 ``BlockPool.get_new_blocks``: pop ``n`` blocks from the front; evict any hash they
    still carry (``BlockRemoved`` per key); each gets ``ref_cnt = 1``.

    Asking for more than the free count is a bug in the caller's prediction (vLLM raises
    ``ValueError``); ``allocate_slots`` checks capacity first, so the spec never does.
    """
    assert num_blocks >= 0, f"negative block count {num_blocks}"
    if num_blocks > len(pool.free_queue):
        raise ValueError(f"Cannot get {num_blocks} free blocks from the pool ({len(pool.free_queue)} free)")
    queue, popped = queue_popleft(pool.free_queue, num_blocks)
    taken = cast(tuple[BlockId, ...], popped)
    if pool.enable_caching and any(pool.block_key[b] is not None for b in taken):
        edit = _HashEdit(pool)
        for b in taken:
            edit.maybe_evict_cached_block(b)
        pool = edit.freeze()
    for b in taken:
        assert pool.ref_cnt[b] == 0, f"block {b} in the free queue has ref_cnt {pool.ref_cnt[b]}"
    return replace(pool, ref_cnt=vec_set(pool.ref_cnt, dict.fromkeys(taken, 1)), free_queue=queue), taken


def free_blocks(pool: BlockPool, ordered_blocks: Iterable[BlockId], split: bool = True) -> BlockPool:
    """vLLM 0.33 ``BlockPool.free_blocks``; ``ordered_blocks`` come first-to-evict first.

    Each non-null block drops one reference.  Blocks reaching 0 rejoin the queue: in 0.33, unhashed
    ones (or all, with caching off) are prepended in the given order (LIFO reuse), hashed ones are
    appended (LRU eviction).  Hashes are kept.  Where the profile says otherwise
    (``frees_to_front``), or the caller asks for no split (``split=False``: vLLM 0.23's
    ``free_blocks(blocks)`` without ``prepend``), all of them are appended."""
    front = split and frees_to_front(pool)
    ref: dict[int, int] = {}
    to_front: list[BlockId] = []
    to_tail: list[BlockId] = []
    for b in ordered_blocks:
        if b == NULL_BLOCK_ID:
            continue
        count = ref[b] if b in ref else pool.ref_cnt[b]
        assert count > 0, f"block {b} freed with ref_cnt {count}"
        ref[b] = count - 1
        if count == 1:
            if front and (pool.block_key[b] is None or not pool.enable_caching):
                to_front.append(b)
            else:
                to_tail.append(b)
    queue = queue_push(pool.free_queue, to_front, to_tail)
    return replace(pool, ref_cnt=vec_set(pool.ref_cnt, ref), free_queue=queue)


def frees_to_front(pool: BlockPool) -> bool:
    """Whether ``free_blocks`` puts freed unhashed blocks (every block, with caching off) at the
    front of the queue: yes, except with caching off in vLLM 0.27.x (``caching_off_free_order ==
    "tail"``; 0.28 restored the front) and in the what-if profile of vLLM 0.20."""
    profile = pool.profile
    return profile.free_order == "split" and (pool.enable_caching or profile.caching_off_free_order == "front")


def finish_free_splits(profile: Profile, kind: str) -> bool:
    """Whether ``SingleTypeKVCacheManager.free`` of a group of attention ``kind`` lets
    ``free_blocks`` split (``frees_to_front``): always from vLLM 0.24 on; in 0.23 only sliding window
    did, the base ``free`` appended every freed block (``finish_free_order == "append"``)."""
    return profile.finish_free_order == "split" or kind == "sliding_window"


class _HashEdit:
    """A private, mutable view of the pool's hash bookkeeping, for one operation.

    vLLM's helpers (``_insert_block_hash``, ``_remove_cached_block_hashes``,
    ``_maybe_evict_cached_block``) mutate the pool step by step; the spec runs the same steps on
    overlays of the hash fields (``spec.persistent.VecOverlay`` / ``MapOverlay``: the writes kept
    aside, the pool untouched) and freezes the result, writing only what changed.
    """

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.keys: VecOverlay[BlockKey | None] = VecOverlay(pool.block_key)
        self.key_tokens: VecOverlay[int | None] = VecOverlay(pool.block_key_tokens)
        self.secondary: MapOverlay[BlockId, tuple[BlockKey, ...]] = MapOverlay(pool.secondary_keys)
        self.cached: MapOverlay[BlockKey, tuple[BlockId, ...]] = MapOverlay(pool.cached)
        self.events = list(pool.events)

    def freeze(self) -> BlockPool:
        return replace(
            self.pool,
            block_key=self.keys.freeze(),
            block_key_tokens=self.key_tokens.freeze(),
            secondary_keys=self.secondary.freeze(),
            cached=self.cached.freeze(),
            events=tuple(self.events),
        )

    def contains(self, key: BlockKey, b: BlockId) -> bool:
        return b in self.cached.get(key, ())

    def insert_block_hash(self, key: BlockKey, b: BlockId, num_tokens: int) -> None:
        """vLLM 0.33 ``_insert_block_hash``: the first key becomes the block's primary, later ones
        secondary; the map gains the block under the key (after any other block: no dedup)."""
        if self.keys[b] == key or self.contains(key, b):
            return
        if self.keys[b] is None:
            self.keys[b] = key
            self.key_tokens[b] = num_tokens
        else:
            self.secondary[b] = self.secondary.get(b, ()) + (key,)
        self.cached[key] = self.cached.get(key, ()) + (b,)

    def remove_cached_block_hashes(self, b: BlockId) -> list[BlockKey]:
        """vLLM 0.33 ``_remove_cached_block_hashes``: pop the block from the map under its primary
        and secondary keys (other blocks under a key stay), then forget its hash.  Returns the keys
        actually removed."""
        primary = self.keys[b]
        keys = ([primary] if primary is not None else []) + list(self.secondary.pop(b, ()))
        removed = []
        for key in keys:
            holders = self.cached.get(key, ())
            if b in holders:
                rest = tuple(x for x in holders if x != b)
                if rest:
                    self.cached[key] = rest
                else:
                    self.cached.pop(key)
                removed.append(key)
        self.keys[b] = None
        self.key_tokens[b] = None
        return removed

    def emit_block_removed(self, keys: Sequence[BlockKey]) -> None:
        if self.pool.enable_kv_cache_events:
            self.events.extend(BlockRemoved((get_published_hash(get_block_hash(k)),), get_group_id(k)) for k in keys)

    def maybe_evict_cached_block(self, b: BlockId) -> None:
        """vLLM 0.33 ``_maybe_evict_cached_block``: drop every key of the block, one
        ``BlockRemoved`` per key removed."""
        self.emit_block_removed(self.remove_cached_block_hashes(b))


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
    blocks whose ``block_mask`` entry (aligned with the new range) is False are skipped.  A block
    that carries a partial entry is promoted: its old keys go first (``BlockRemoved``).  One
    ``BlockStored`` covers the whole token range, even when every block was skipped.
    """
    if num_cached_blocks >= num_full_blocks:
        return pool
    assert len(block_hashes) >= num_full_blocks, "caching a block whose hash does not exist yet"
    assert len(blocks) >= num_full_blocks, "caching past the end of the block table"
    assert block_mask is None or len(block_mask) == num_full_blocks - num_cached_blocks
    edit = _HashEdit(pool)
    stored: list[BlockHash] = []
    for i in range(num_cached_blocks, num_full_blocks):
        b = blocks[i]
        if b == NULL_BLOCK_ID or (block_mask is not None and not block_mask[i - num_cached_blocks]):
            continue
        num_hash_tokens = (i + 1) * block_size
        if edit.keys[b] is not None:
            # Only a partial entry of this very block may be there: promote it.
            tokens = edit.key_tokens[b]
            assert tokens is not None and tokens < num_hash_tokens, f"block {b} is already hashed"
            edit.emit_block_removed(edit.remove_cached_block_hashes(b))
        edit.insert_block_hash(make_block_key(block_hashes[i], group_id), b, num_hash_tokens)
        stored.append(get_published_hash(block_hashes[i]))
    if pool.enable_kv_cache_events:
        parent = get_published_hash(block_hashes[num_cached_blocks - 1]) if num_cached_blocks > 0 else None
        edit.events.append(
            BlockStored(
                block_hashes=tuple(stored),
                parent_block_hash=parent,
                token_ids=tuple(all_token_ids[num_cached_blocks * block_size : num_full_blocks * block_size]),
                block_size=TokenCount(block_size),
                group_id=group_id,
            )
        )
    return edit.freeze()


def cache_partial_block(
    pool: BlockPool,
    all_token_ids: Sequence[int],
    fine_block_hashes: Sequence[BlockHash],
    block: BlockId,
    num_tokens: int,
    hash_block_size: int,
    group_id: GroupId,
) -> BlockPool:
    """vLLM 0.33 ``BlockPool.cache_partial_block``: make ``block`` reachable under the prefix
    hash at ``num_tokens`` (a multiple of the hash block size inside the block).

    The key is the request's fine hash at that boundary.  A shorter entry the block already
    carries is removed first; nothing happens if the key is already there.  The ``BlockStored``
    covers just the last hash block before the boundary.
    """
    if block == NULL_BLOCK_ID:
        return pool
    assert num_tokens % hash_block_size == 0 and 0 < num_tokens // hash_block_size <= len(fine_block_hashes)
    num_hash_blocks = num_tokens // hash_block_size
    block_hash = fine_block_hashes[num_hash_blocks - 1]
    key = make_block_key(block_hash, group_id)
    edit = _HashEdit(pool)
    already_cached = edit.keys[block] == key or edit.contains(key, block)
    tokens = edit.key_tokens[block]
    if not already_cached and edit.keys[block] is not None and tokens is not None and tokens < num_tokens:
        edit.emit_block_removed(edit.remove_cached_block_hashes(block))
    edit.insert_block_hash(key, block, num_tokens)
    if pool.enable_kv_cache_events and not already_cached:
        start = (num_hash_blocks - 1) * hash_block_size
        edit.events.append(
            BlockStored(
                block_hashes=(block_hash,),
                parent_block_hash=fine_block_hashes[num_hash_blocks - 2] if num_hash_blocks > 1 else None,
                token_ids=tuple(all_token_ids[start:num_tokens]),
                block_size=TokenCount(num_tokens - start),
                group_id=group_id,
            )
        )
    return edit.freeze()


def evict_blocks(pool: BlockPool, block_ids: Iterable[int]) -> BlockPool:
    """vLLM 0.33 ``BlockPool.evict_blocks``: remove the hashes of the given blocks whatever their
    ref count; ref counts and the free queue are untouched (used after KV-load failures)."""
    edit = _HashEdit(pool)
    for b in block_ids:
        assert 0 <= b < pool.num_blocks, f"invalid block id {b} (pool has {pool.num_blocks} blocks)"
        edit.maybe_evict_cached_block(BlockId(b))
    return edit.freeze()


def reset_prefix_cache(pool: BlockPool) -> tuple[BlockPool, bool]:
    """vLLM 0.33 ``BlockPool.reset_prefix_cache``: refuse (False, no change) unless every usable
    block is free; otherwise forget every hash, keep the queue order, emit ``AllBlocksCleared``."""
    if pool.num_blocks - len(pool.free_queue) != 1:  # the null block always counts as used
        return pool, False
    events = pool.events + ((AllBlocksCleared(),) if pool.enable_kv_cache_events else ())
    keys, key_tokens, secondary, cached = _no_hashes(pool.num_blocks, is_persistent(pool))
    return replace(
        pool, block_key=keys, block_key_tokens=key_tokens, secondary_keys=secondary, cached=cached, events=events
    ), True


def take_events(pool: BlockPool) -> tuple[BlockPool, tuple[Event, ...]]:
    """vLLM 0.33 ``BlockPool.take_events``: drain the queue (empty when events are disabled)."""
    return replace(pool, events=()), pool.events
