"""Spec mutants aimed at the invariants: one small, realistic slip per check of ``spec.invariants``.

Like ``harness.mutants.spec``, each entry wraps one spec function (``--target mutant:NAME`` runs it
as the target against the unmutated spec).  ``kvspec mutants`` runs them in ``self`` mode: the spec
itself, reference included, carries the bug, so only the invariants (which keep the original code)
can see it; each record's ``intended`` names the invariant it is written to trip.  The wrappers call
the original function and change its arguments or its result, the way the slip would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from kvspec.harness.mutants.record import Mode, Mutant, Patch, Wrap, by_name, doc_of
from kvspec.spec import block_pool, managers
from kvspec.spec.types import NULL_BLOCK_ID, BlockId, GroupId


def _pool_with(result: Any, **changes: Any) -> Any:
    return dataclasses.replace(result, **changes)


def _null_block_queued(orig: Callable[..., Any]) -> Callable[..., Any]:
    """The pool is built without popping block 0 for the null block: it is queued like the others."""

    def init_block_pool(num_blocks: int, *args: Any, **kwargs: Any) -> Any:
        pool = orig(num_blocks, *args, **kwargs)
        return _pool_with(pool, free_queue=(BlockId(NULL_BLOCK_ID),) + pool.free_queue)

    return init_block_pool


def _free_queues_twice(orig: Callable[..., Any]) -> Callable[..., Any]:
    """A missing ``else`` in ``free_blocks``: an unhashed block reaching 0 is prepended *and* appended."""

    def free_blocks(pool: Any, ordered_blocks: Any, split: bool = True) -> Any:
        out = orig(pool, list(ordered_blocks), split)
        old = set(pool.free_queue)
        again = tuple(b for b in out.free_queue if b not in old and out.block_key[b] is None)
        return _pool_with(out, free_queue=out.free_queue + again)

    return free_blocks


def _touch_keeps_queued(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``touch`` takes the reference but forgets to unlink a free hit from the free queue."""

    def touch(pool: Any, blocks: Any) -> Any:
        return _pool_with(orig(pool, blocks), free_queue=pool.free_queue)

    return touch


def _free_leaks_block(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``free_blocks`` drops the last block reaching ref count 0 instead of queueing it (a leak)."""

    def free_blocks(pool: Any, ordered_blocks: Any, split: bool = True) -> Any:
        out = orig(pool, list(ordered_blocks), split)
        fresh = [b for b in out.free_queue if b not in set(pool.free_queue)]
        return _pool_with(out, free_queue=tuple(b for b in out.free_queue if b != fresh[-1])) if fresh else out

    return free_blocks


def _map_entry_dropped(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``cache_full_blocks`` sets the block's hash but the map insert of the last block is lost."""

    def cache_full_blocks(pool: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig(pool, *args, **kwargs)
        new = [k for k in out.cached if k not in pool.cached]
        if not new:
            return out
        return _pool_with(out, cached={k: v for k, v in out.cached.items() if k != new[-1]})

    return cache_full_blocks


def _hash_ignores_parent(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Block hashes are not chained: every block hashes from ``NONE_HASH`` (equal blocks anywhere in
    two prompts collide)."""

    def hash_block_tokens(hash_fn: Any, none_hash: Any, parent: Any, token_ids: Any, extra_keys: Any) -> Any:
        return orig(hash_fn, none_hash, None, token_ids, extra_keys)

    return hash_block_tokens


def _lookahead_past_max_len(orig: Callable[..., Any]) -> Callable[..., Any]:
    """At ``max_model_len`` the lookahead still gets a slot: one block past the table's bound."""

    def allocate_new_blocks(state: Any, request_id: Any, num_tokens: int, *args: Any) -> Any:
        out, new = orig(state, request_id, num_tokens, *args)
        if num_tokens < state.config.max_model_len or not out.pool.free_queue:
            return out, new
        return orig(state, request_id, num_tokens + state.config.groups[0].block_size, *args)

    return allocate_new_blocks


def _full_attention_skips(orig: Callable[..., Any]) -> Callable[..., Any]:
    """The skip formula is applied to every group: full attention is treated as a window of
    four blocks, so its old blocks are replaced by the null block."""

    def get_num_skipped_tokens(spec: Any, num_computed_tokens: int) -> int:
        if spec.kind == "full":
            return max(0, num_computed_tokens - 4 * int(spec.block_size) + 1)
        return int(orig(spec, num_computed_tokens))

    return get_num_skipped_tokens


def _cached_count_kept_on_free(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``free`` pops the table but leaves the request's ``num_cached_block`` behind."""

    def free(state: Any, gid: Any, request_id: Any) -> Any:
        out = orig(state, gid, request_id)
        if request_id not in state.groups[gid].num_cached_block:
            return out
        group = out.groups[gid]
        kept = dataclasses.replace(group, num_cached_block={**group.num_cached_block, request_id: 0})
        return dataclasses.replace(out, groups=out.groups[:gid] + (kept,) + out.groups[gid + 1 :])

    return free


def _hit_stops_one_early(orig: Callable[..., Any]) -> Callable[..., Any]:
    """The full-attention hit walk stops one block before the cap (``range(n - 1)``)."""

    def find_longest_cache_hit_full(
        cached_at: Any, num_groups: int, max_length: int, block_size: int, alignment: int
    ) -> Any:
        return orig(cached_at, num_groups, max(0, max_length - block_size), block_size, alignment)

    return find_longest_cache_hit_full


def _over_allocates(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Rounding up twice: a growing table takes one block more than ``cdiv(need, bs)``."""

    def get_num_new_blocks_to_allocate(num_tokens: int, block_size: int, num_held_blocks: int) -> int:
        n = int(orig(num_tokens, block_size, num_held_blocks))
        return n + 1 if n > 0 else n

    return get_num_new_blocks_to_allocate


def _reset_counts_null_block(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``reset_prefix_cache`` counts the null block as a block in use, so it is always refused."""

    def reset_prefix_cache(pool: Any) -> Any:
        if pool.num_blocks - len(pool.free_queue) == 1:
            return pool, False
        return orig(pool)

    return reset_prefix_cache


def _evict_skips_referenced(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``evict_blocks`` only evicts free blocks: a failed load's blocks, still referenced, keep
    their hashes (vLLM 0.33 evicts them whatever their ref count)."""

    def evict_blocks(pool: Any, block_ids: Any) -> Any:
        return orig(pool, [b for b in block_ids if pool.ref_cnt[b] == 0])

    return evict_blocks


def _removed_events_lost(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``take_events`` hands out only ``BlockStored`` / ``AllBlocksCleared``: removals are lost."""

    def take_events(pool: Any) -> Any:
        out, events = orig(pool)
        return out, tuple(e for e in events if type(e).__name__ != "BlockRemoved")

    return take_events


def _failed_allocation_keeps_blocks(orig: Callable[..., Any]) -> Callable[..., Any]:
    """No rollback: a refused ``allocate_slots`` keeps the one block it could take."""

    def allocate_slots(state: Any, request: Any, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
        out, blocks = orig(state, request, num_new_tokens, *args, **kwargs)
        table = out.groups[0].req_to_blocks.get(request.request_id, ())
        if blocks is not None or not out.pool.free_queue:
            return out, blocks
        bs = out.config.groups[0].block_size
        grown, _ = managers.allocate_new_blocks(out, GroupId(0), request.request_id, (len(table) + 1) * bs)
        return grown, None

    return allocate_slots


def _free_hashed_to_front(orig: Callable[..., Any]) -> Callable[..., Any]:
    """LIFO for every freed block: the hashed ones are prepended too, so cached prefixes are evicted first."""

    def free_blocks(pool: Any, ordered_blocks: Any, split: bool = True) -> Any:
        out = orig(pool, list(ordered_blocks), split)
        old = set(pool.free_queue)
        hashed = tuple(b for b in out.free_queue if b not in old and out.block_key[b] is not None)
        return _pool_with(out, free_queue=hashed + tuple(b for b in out.free_queue if b not in hashed))

    return free_blocks


def _free_evicts_eagerly(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``free`` drops the hashes of the blocks it releases (eager eviction): no hit after a request ends."""

    def free_blocks(pool: Any, ordered_blocks: Any, split: bool = True) -> Any:
        ids = list(ordered_blocks)
        last = [b for b in set(ids) if b != NULL_BLOCK_ID and pool.ref_cnt[b] == ids.count(b)]
        return orig(block_pool.evict_blocks(pool, last) if last else pool, ids, split)

    return free_blocks


def _key_without_group(orig: Callable[..., Any]) -> Callable[..., Any]:
    """The group id is left out when publishing: every group's blocks are stored under group 0's key."""

    def cache_full_blocks(
        pool: Any,
        tokens: Any,
        view: Any,
        table: Any,
        num_cached: int,
        num_full: int,
        block_size: int,
        gid: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        return orig(pool, tokens, view, table, num_cached, num_full, block_size, GroupId(0), *args, **kwargs)

    return cache_full_blocks


def _adopt_reversed(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Prefix hits adopted in reverse order (the hit list was built from the tail)."""

    def add_local_computed_blocks(state: Any, gid: Any, request_id: Any, blocks: Any, *args: Any) -> Any:
        return orig(state, gid, request_id, tuple(reversed(blocks)), *args)

    return add_local_computed_blocks


def _cached_count_past_table(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Off by one recording the cached count of a fully cached table: ``len(table) + 1``."""

    def cache_blocks(state: Any, gid: Any, request: Any, num_tokens: int, alignment: int) -> Any:
        out = orig(state, gid, request, num_tokens, alignment)
        rid = request.request_id
        group = out.groups[gid]
        n, table = group.num_cached_block.get(rid), group.req_to_blocks.get(rid, ())
        if n is None or n != len(table) or n == state.groups[gid].num_cached_block.get(rid):
            return out
        bumped = dataclasses.replace(group, num_cached_block={**group.num_cached_block, rid: n + 1})
        return dataclasses.replace(out, groups=out.groups[:gid] + (bumped,) + out.groups[gid + 1 :])

    return cache_blocks


def _store_recycles_duplicate(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Dedup on store: publishing a key that an older free block holds evicts that block and moves it
    to the front of the free queue (vLLM 0.33 keeps both and leaves the queue alone)."""

    def cache_blocks(state: Any, gid: Any, request: Any, num_tokens: int, alignment: int) -> Any:
        out = orig(state, gid, request, num_tokens, alignment)
        pool = out.pool
        old = [
            ids[0]
            for k, ids in pool.cached.items()
            if len(ids) > len(state.pool.cached.get(k, ())) > 0 and pool.ref_cnt[ids[0]] == 0
        ]
        if not old:
            return out
        pool = block_pool.evict_blocks(pool, old)
        pool = _pool_with(pool, free_queue=tuple(old) + tuple(b for b in pool.free_queue if b not in old))
        return dataclasses.replace(out, pool=pool)

    return cache_blocks


def _aimed(
    name: str,
    owner: str,
    attr: str,
    wrap: Wrap,
    intended: str,
    family: str = "full",
    modes: tuple[Mode, ...] = ("self",),
) -> Mutant:
    """A spec mutant aimed at the invariant ``intended``."""
    return Mutant(name, "spec", doc_of(wrap), family, modes, intended, Patch(owner, attr, wrap))


# ``modes``: ``self`` unless said.  A hashing mutant cannot run in self mode: the invariants recompute
# hashes with ``spec.hashing`` (and memoize them), so it runs as the target, its observation checked
# by the invariants; the lost events also run that way, where the event ledger (``events_replay``)
# sees them.  ``intended``: the invariant each one is written to trip (the campaign reports what
# actually fired).
MUTANTS: dict[str, Mutant] = by_name(
    (
        _aimed(
            "null_block_queued", "kvspec.spec.block_pool", "init_block_pool", _null_block_queued, "null_block_is_inert"
        ),
        _aimed(
            "free_queues_twice", "kvspec.spec.block_pool", "free_blocks", _free_queues_twice, "free_queue_well_formed"
        ),
        _aimed("touch_keeps_queued", "kvspec.spec.block_pool", "touch", _touch_keeps_queued, "free_iff_unreferenced"),
        _aimed("free_leaks_block", "kvspec.spec.block_pool", "free_blocks", _free_leaks_block, "conservation"),
        _aimed(
            "map_entry_dropped",
            "kvspec.spec.block_pool",
            "cache_full_blocks",
            _map_entry_dropped,
            "hash_map_matches_blocks",
        ),
        _aimed(
            "hash_ignores_parent",
            "kvspec.spec.hashing",
            "hash_block_tokens",
            _hash_ignores_parent,
            "hash_chain",
            modes=("invariants",),
        ),
        _aimed(
            "lookahead_past_max_len",
            "kvspec.spec.coordinator",
            "allocate_new_blocks",
            _lookahead_past_max_len,
            "table_length_bounded",
        ),
        _aimed(
            "full_attention_skips",
            "kvspec.spec.managers",
            "get_num_skipped_tokens",
            _full_attention_skips,
            "null_pattern",
        ),
        _aimed(
            "cached_count_kept_on_free", "kvspec.spec.managers", "free", _cached_count_kept_on_free, "dict_membership"
        ),
        _aimed(
            "hit_stops_one_early",
            "kvspec.spec.managers",
            "find_longest_cache_hit_full",
            _hit_stops_one_early,
            "full_attention_hit_is_maximal",
        ),
        _aimed(
            "over_allocates",
            "kvspec.spec.arith",
            "get_num_new_blocks_to_allocate",
            _over_allocates,
            "successful_allocation_is_exact",
        ),
        _aimed(
            "reset_counts_null_block",
            "kvspec.spec.block_pool",
            "reset_prefix_cache",
            _reset_counts_null_block,
            "reset_only_when_all_free",
        ),
        _aimed(
            "evict_skips_referenced",
            "kvspec.spec.block_pool",
            "evict_blocks",
            _evict_skips_referenced,
            "evict_only_touches_hashes",
            family="events",
        ),
        _aimed(
            "removed_events_lost",
            "kvspec.spec.block_pool",
            "take_events",
            _removed_events_lost,
            "events_rebuild_hash_map (self), events_replay (invariants)",
            family="events",
            modes=("self", "invariants"),
        ),
        _aimed(
            "failed_allocation_keeps_blocks",
            "kvspec.spec.kv_cache_manager",
            "allocate_slots",
            _failed_allocation_keeps_blocks,
            "failed_allocation_changes_nothing",
        ),
        _aimed(
            "free_hashed_to_front",
            "kvspec.spec.block_pool",
            "free_blocks",
            _free_hashed_to_front,
            "free_queue_partition",
        ),
        _aimed(
            "free_evicts_eagerly",
            "kvspec.spec.block_pool",
            "free_blocks",
            _free_evicts_eagerly,
            "free_releases_everything",
        ),
        _aimed(
            "key_without_group",
            "kvspec.spec.block_pool",
            "cache_full_blocks",
            _key_without_group,
            "one_group_per_block",
            family="hybrid_equal",
        ),
        _aimed(
            "adopt_reversed",
            "kvspec.spec.managers",
            "add_local_computed_blocks",
            _adopt_reversed,
            "sharing_only_through_prefix",
        ),
        _aimed(
            "cached_count_past_table", "kvspec.spec.managers", "cache_blocks", _cached_count_past_table, "cache_bounds"
        ),
        _aimed(
            "store_recycles_duplicate",
            "kvspec.spec.managers",
            "cache_blocks",
            _store_recycles_duplicate,
            "cache_blocks_publishes_full_blocks",
        ),
    )
)
