"""Reading a vLLM ``KVCacheManager``'s state in the spec's vocabulary: the one reader of vLLM
internals for ``harness.targets.vllm.VllmTarget``.  Where releases store things differently
(``harness.targets.vllm_release.VllmApi``: the block's hash attributes, the hash map's storage,
secondary keys from 0.26 on), the ``Reader`` built once per release reads each form.

``observe_manager`` reads the whole state (single-type managers' tables, the block pool's blocks,
free list and hash map) into an ``Observation``; ``glimpse_manager`` reads the part one operation
can change (``harness.core.glimpse``) without walking the pool or the free list.  The requests'
block hashes come from the adapter, which keeps them per request.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from operator import attrgetter
from typing import Any

from kvspec.harness.core.glimpse import BlockFacts, Glimpse, GlimpseView, build_glimpse
from kvspec.harness.core.observation import Observation
from kvspec.harness.targets.vllm_release import VllmApi


class Reader:
    """How one release stores a block's key and the hash map (``VllmApi``).

    A release whose blocks do not record the tokens their key covers (before 0.24, where every key
    is a full block's) gets them from ``key_tokens``: key -> tokens, derived by the adapter from the
    request hashes it has seen."""

    def __init__(self, api: VllmApi, key_tokens: Callable[[Any], int | None] | None = None) -> None:
        block_key = self.block_key = attrgetter(api.hash_attr)
        tokens = api.hash_tokens_attr
        self.block_key_tokens: Callable[[Any], int | None]
        if tokens:
            self.block_key_tokens = attrgetter(tokens)
        elif key_tokens is not None:
            self.block_key_tokens = lambda blk: key_tokens(block_key(blk))
        else:
            self.block_key_tokens = _none
        self.map_holds_ids = api.map_holds_ids

    def cached_map(self, pool: Any) -> dict[bytes, tuple[int, ...]]:
        """``BlockHashToBlockMap`` as key -> block ids in insertion order (first: the one lookups return)."""
        cache_map = pool.cached_block_hash_to_block
        if self.map_holds_ids:  # 0.34: key -> block id; keys held by several blocks also in _dup_ids
            dups = cache_map._dup_ids
            return {bytes(k): tuple(dups[k]) if k in dups else (b,) for k, b in cache_map._cache.items()}
        return _cached_map(cache_map)

    def cached_ids(self, pool: Any, key: bytes) -> tuple[int, ...]:
        """The block ids one key holds (empty when none)."""
        cache_map = pool.cached_block_hash_to_block
        held = cache_map._cache.get(key)
        if held is None:
            return ()
        if self.map_holds_ids:
            dups = cache_map._dup_ids.get(key)
            return tuple(dups) if dups is not None else (held,)
        return tuple(b.block_id for b in held.values()) if isinstance(held, dict) else (held.block_id,)


def _none(_: Any) -> None:
    return None


def _secondary(pool: Any) -> dict[int, Any]:
    """``cached_block_hashes_by_block`` (from 0.26 on; none before)."""
    return getattr(pool, "cached_block_hashes_by_block", None) or {}


def observe_manager(manager: Any, reader: Reader, request_hashes: dict[str, tuple[bytes, ...]]) -> Observation:
    """The whole state of ``manager``; ``request_hashes``: each booked request's block hashes."""
    managers = manager.coordinator.single_type_managers
    pool = manager.block_pool
    # Per-block fields read with ``map`` and ``attrgetter`` (the walk runs in C).
    ref_cnt = list(map(_REF_CNT, pool.blocks))
    ref_cnt[pool.null_block.block_id] = 0  # the null block's count is not maintained
    return Observation(
        # req_to_blocks is a defaultdict: a lookup of an unknown id (remove_skipped_blocks, a
        # failed allocation) leaves an empty table behind; it is reported as vLLM holds it.
        tables=tuple(
            {rid: tuple(b.block_id for b in blocks) for rid, blocks in m.req_to_blocks.items()} for m in managers
        ),
        num_cached_block=tuple(dict(m.num_cached_block) for m in managers),
        ref_cnt=tuple(ref_cnt),
        free_queue=_free_queue_ids(pool.free_block_queue),
        block_key=tuple(map(reader.block_key, pool.blocks)),
        cached=reader.cached_map(pool),
        request_block_hashes=request_hashes,
        block_key_tokens=tuple(map(reader.block_key_tokens, pool.blocks)),
        secondary_keys={bid: frozenset(bytes(k) for k in keys) for bid, keys in _secondary(pool).items() if keys},
    )


def glimpse_manager(
    manager: Any,
    reader: Reader,
    hashes: Callable[[str], tuple[bytes, ...] | None],
    requests: Sequence[str],
    blocks: Collection[int],
    keys: Collection[bytes],
) -> Glimpse:
    """What one operation of ``requests`` can change in ``manager`` (``harness.core.glimpse``);
    ``hashes``: a request's block hashes, None for a request not in the book."""
    managers = manager.coordinator.single_type_managers
    pool = manager.block_pool
    null_id = pool.null_block.block_id
    by_block = _secondary(pool)
    cache = pool.cached_block_hash_to_block._cache
    block_key, block_key_tokens = reader.block_key, reader.block_key_tokens

    def facts(b: int) -> BlockFacts:
        blk = pool.blocks[b]
        key = block_key(blk)
        held = by_block.get(b)
        secondary = frozenset(bytes(k) for k in held) if held else _NO_KEYS
        ref = 0 if b == null_id else blk.ref_cnt
        return ref, None if key is None else bytes(key), block_key_tokens(blk), secondary

    def cached(k: bytes) -> tuple[int, ...]:
        return reader.cached_ids(pool, k)

    view = GlimpseView(
        tables=[_TableView(m.req_to_blocks) for m in managers],
        num_cached=[m.num_cached_block for m in managers],
        facts=facts,
        cached=cached,
        num_free=pool.free_block_queue.num_free_blocks,
        free_ends=lambda k: _free_queue_ends(pool.free_block_queue, k),
        num_cached_keys=len(cache),
        hashes=hashes,
    )
    return build_glimpse(view, requests, blocks, keys)


_REF_CNT = attrgetter("ref_cnt")
_NO_KEYS: frozenset[bytes] = frozenset()


def _free_queue_ids(queue: Any) -> tuple[int, ...]:
    """Walk ``FreeKVCacheBlockQueue`` from the head sentinel: front (evicted first) to tail."""
    ids = []
    block = queue.fake_free_list_head.next_free_block
    while block is not None and block is not queue.fake_free_list_tail:
        ids.append(block.block_id)
        block = block.next_free_block
    if len(ids) != queue.num_free_blocks:
        raise AssertionError(f"vLLM free list holds {len(ids)} blocks but counts {queue.num_free_blocks}")
    return tuple(ids)


def _free_queue_ends(queue: Any, k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The first and the last ``k`` blocks of ``FreeKVCacheBlockQueue`` (from its two sentinels)."""
    n = min(k, queue.num_free_blocks)
    head: list[int] = []
    tail: list[int] = []
    block = queue.fake_free_list_head.next_free_block
    while len(head) < n and block is not None and block is not queue.fake_free_list_tail:
        head.append(block.block_id)
        block = block.next_free_block
    block = queue.fake_free_list_tail.prev_free_block
    while len(tail) < n and block is not None and block is not queue.fake_free_list_head:
        tail.append(block.block_id)
        block = block.prev_free_block
    return tuple(head), tuple(reversed(tail))


class _TableView:
    """``req_to_blocks`` (a defaultdict of ``KVCacheBlock`` lists) read without creating entries."""

    def __init__(self, tables: Any) -> None:
        self._tables = tables

    def get(self, rid: str) -> tuple[int, ...] | None:
        blocks = self._tables.get(rid)
        return None if blocks is None else tuple(b.block_id for b in blocks)


def _cached_map(cache_map: Any) -> dict[bytes, tuple[int, ...]]:
    """``BlockHashToBlockMap`` up to 0.33: a key holds one ``KVCacheBlock`` or, once a second block
    was inserted under it, a ``{block_id: block}`` dict in insertion order."""
    out: dict[bytes, tuple[int, ...]] = {}
    for key, held in cache_map._cache.items():
        if isinstance(held, dict):
            out[bytes(key)] = tuple(b.block_id for b in held.values())
        else:
            out[bytes(key)] = (held.block_id,)
    return out
