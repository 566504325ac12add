"""State invariants: predicates over one ``StateContext`` (docs/semantics.md §9.1-§9.16, §9.20, §9.21).

Engine-neutral unless tagged ``VLLM_POLICY`` (vLLM's lazy eviction, free order and event stream):
a neutral one holds for any correct block cache reported in the spec's vocabulary.

Each returns ``None`` when its rule holds, or a message naming the witness.  They are a second
reading of the rules, written from docs/semantics.md rather than from the operations in ``spec/``.
"""

from __future__ import annotations

from collections import Counter

from kvspec.spec.config import KVCacheConfig
from kvspec.spec.hashing import get_published_hash
from kvspec.spec.invariants.memo import recompute_hashes, replay, taken_counts
from kvspec.spec.invariants.registry import SPEC_INVARIANTS, VLLM_POLICY, StateContext
from kvspec.spec.types import (
    NULL_BLOCK_ID,
    BlockId,
    BlockKey,
    GroupId,
    get_block_hash,
    get_group_id,
    make_block_key,
)

# --- pool and free queue ---------------------------------------------------------------------------


@SPEC_INVARIANTS.register("§9.1", "state")
def null_block_is_inert(c: StateContext) -> str | None:
    """The null block (id 0) is never free, never hashed, never stored in the map, and its ref
    count is not maintained (the spec keeps it at 0)."""
    pool = c.state.pool
    if NULL_BLOCK_ID in c.free_set:
        return "block 0 is in the free queue"
    if pool.block_key[NULL_BLOCK_ID] is not None:
        return "block 0 is hashed"
    if pool.ref_cnt[NULL_BLOCK_ID] != 0:
        return f"block 0 has ref_cnt {pool.ref_cnt[NULL_BLOCK_ID]}"
    for key, blocks in pool.cached.items():
        if NULL_BLOCK_ID in blocks:
            return f"block 0 is stored under key {key.hex()[:16]}"
    return None


@SPEC_INVARIANTS.register("§9.2", "state")
def free_queue_well_formed(c: StateContext) -> str | None:
    """The free queue holds distinct real block ids, each in ``[1, num_blocks)``."""
    queue = c.state.pool.free_queue
    if len(c.free_set) != len(queue):
        dup = [b for b, n in Counter(queue).items() if n > 1]
        return f"block(s) {dup} appear more than once in the free queue"
    if not queue or 0 < min(queue) and max(queue) < c.state.pool.num_blocks:
        return None
    bad = [b for b in queue if not 0 < b < c.state.pool.num_blocks]
    return f"free queue holds invalid id(s) {bad}"


@SPEC_INVARIANTS.register("§9.3", "state", VLLM_POLICY)
def free_iff_unreferenced(c: StateContext) -> str | None:
    """For every real block: in the free queue exactly when ``ref_cnt == 0``; never negative.
    vLLM's lazy eviction: an unreferenced block is free at once, keeping its key until reused."""
    ref = c.state.pool.ref_cnt
    unreferenced = {b for b, n in enumerate(ref) if n == 0}
    unreferenced.discard(NULL_BLOCK_ID)
    if unreferenced == c.free_set and min(ref) >= 0:
        return None
    for b in range(1, c.state.pool.num_blocks):
        if ref[b] < 0:
            return f"block {b} has negative ref_cnt {ref[b]}"
        if (ref[b] == 0) != (b in c.free_set):
            where = "in" if b in c.free_set else "not in"
            return f"block {b} has ref_cnt {ref[b]} but is {where} the free queue"
    return None


@SPEC_INVARIANTS.register("§9.4", "state")
def conservation(c: StateContext) -> str | None:
    """Every real block is free, held by a request (``ref_cnt > 0``), or kept by the cache under a
    key: no block is lost.  (In vLLM a kept block is free too, so ``free + in use == num_blocks - 1``;
    SGLang keeps evictable pages in its tree, out of the free pool.)"""
    pool, ref = c.state.pool, c.state.pool.ref_cnt
    if min(ref) >= 0:  # counted in C: the real blocks whose count is not 0
        used = pool.num_blocks - 1 - ref.count(0) + (ref[NULL_BLOCK_ID] == 0)
    else:
        used = sum(1 for b in range(1, pool.num_blocks) if ref[b] > 0)
    if len(c.free_set) + used == pool.num_blocks - 1 and not any(ref[b] > 0 for b in c.free_set):
        return None  # free and in use are disjoint and cover every real block
    keys = pool.block_key
    lost = [b for b in range(1, pool.num_blocks) if b not in c.free_set and ref[b] <= 0 and keys[b] is None]
    if lost:
        return f"block(s) {lost[:8]} are neither free, nor held by a request, nor kept under a key: lost"
    return None


@SPEC_INVARIANTS.register("§9.21", "state")
def no_reuse_while_referenced(c: StateContext) -> str | None:
    """No free block is held by a request (its ref count or a table), and no ref count is negative:
    a block is handed out again only once nobody reads it."""
    ref = c.state.pool.ref_cnt
    if min(ref) < 0:
        b = next(b for b, n in enumerate(ref) if n < 0)
        return f"block {b} has negative ref_cnt {ref[b]}"
    for b in c.free_set:
        if ref[b] > 0:
            return f"free block {b} has ref_cnt {ref[b]}"
        if b in c.references:
            return f"free block {b} is held by {c.references[b][:4]} (group, request, index)"
    return None


@SPEC_INVARIANTS.register("§9.5", "state")
def ref_count_equals_references(c: StateContext) -> str | None:
    """A real block's ref count is the number of table slots, over all groups and requests, that
    hold it: a reference taken is a reference held."""
    expected = [0] * c.state.pool.num_blocks
    for b, refs in c.references.items():
        expected[b] = len(refs)
    expected[NULL_BLOCK_ID] = c.state.pool.ref_cnt[NULL_BLOCK_ID]  # not maintained (§9.1)
    if tuple(expected) == c.state.pool.ref_cnt:
        return None
    bad = next(i for i, n in enumerate(expected) if n != c.state.pool.ref_cnt[i])
    refs = c.references.get(BlockId(bad), [])
    return f"block {bad} has ref_cnt {c.state.pool.ref_cnt[bad]} but {expected[bad]} table reference(s) {refs}"


@SPEC_INVARIANTS.register("§9.6", "state")
def one_group_per_block(c: StateContext) -> str | None:
    """Every reference to a block comes from one group's tables, and a hashed block's key names
    that group."""
    for b, refs in c.references.items():
        groups = {g for g, _, _ in refs}
        if len(groups) > 1:
            return f"block {b} is referenced from groups {sorted(groups)}"
        key = c.state.pool.block_key[b]
        if key is not None and get_group_id(key) not in groups:
            return f"block {b} is hashed for group {get_group_id(key)} but held by group {groups.pop()}"
    return None


@SPEC_INVARIANTS.register("§9.7", "state")
def no_duplicate_in_table(c: StateContext) -> str | None:
    """Within one table a real block appears at most once."""
    for gid, group in enumerate(c.state.groups):
        for rid, table in group.req_to_blocks.items():
            real = [b for b in table if b != NULL_BLOCK_ID]
            if len(set(real)) != len(real):
                dup = [b for b, n in Counter(real).items() if n > 1]
                return f"group {gid} request {rid!r} holds block(s) {dup} twice: {list(table)}"
    return None


@SPEC_INVARIANTS.register("§9.8", "state")
def sharing_only_through_prefix(c: StateContext) -> str | None:
    """A block held by two requests sits at the same index in both, is hashed (unless
    ``evict_blocks`` ran), and both requests have the same hash there: sharing only comes from a
    prefix hit.  Corollary: an unhashed block is held at most once."""
    for b, refs in c.references.items():
        if len(refs) < 2:
            continue
        indexes = {i for _, _, i in refs}
        if len(indexes) > 1:
            return f"block {b} is shared at different table indexes {refs}"
        if c.state.pool.block_key[b] is None and not c.evict_called:
            return f"unhashed block {b} is shared by {[r for _, r, _ in refs]}"
        gid, _, i = refs[0]
        seen = set()
        for _, rid, _ in refs:
            if rid not in c.requests:
                return f"block {b} is held by unknown request {rid!r}"
            view = c.view_hashes(rid, gid)
            seen.add(view[i] if i < len(view) else None)
        if len(seen) != 1 or None in seen:
            return (
                f"block {b} is shared at index {i} by requests with different (or missing) hashes "
                f"{[r for _, r, _ in refs]}"
            )
    return None


@SPEC_INVARIANTS.register("§9.9", "state")
def hash_map_matches_blocks(c: StateContext) -> str | None:
    """Every block stored under a key carries that key, every hashed block is stored under its
    key, keys map to at least one block and never list a block twice (several blocks per key are
    allowed: there is no dedup)."""
    pool = c.state.pool
    from_map = [(key, b) for key, blocks in pool.cached.items() for b in blocks]
    from_blocks = {(key, b) for b, key in enumerate(pool.block_key) if key is not None}
    from_blocks.update((key, b) for b, keys in pool.secondary_keys.items() for key in keys)
    if len(from_map) == len(from_blocks) and set(from_map) == from_blocks and all(pool.cached.values()):
        return None
    for key, blocks in pool.cached.items():
        if not blocks:
            return f"key {key.hex()[:16]} maps to no block"
        if len(set(blocks)) != len(blocks):
            return f"key {key.hex()[:16]} lists a block twice: {list(blocks)}"
        for b in blocks:
            if pool.block_key[b] != key:
                return f"block {b} is stored under key {key.hex()[:16]} but carries {_short(pool.block_key[b])}"
    for blk, own in enumerate(pool.block_key):
        if own is not None and blk not in pool.cached.get(own, ()):
            return f"block {blk} carries key {own.hex()[:16]} but is not stored under it"
        if own is None and blk in pool.secondary_keys:
            return f"block {blk} has secondary keys but no primary key"
    return "the map and the blocks' keys disagree"


@SPEC_INVARIANTS.register("§9.10", "state")
def hashed_means_full_and_correct(c: StateContext) -> str | None:
    """A table slot below the cached count holds a block whose key is exactly the request's hash
    at that index ++ group id (or a null, or a block the hybrid reachability mask left unhashed, or
    one whose hash ``evict_blocks`` removed); a slot at or above it holds an unhashed block, or one
    carrying only a partial entry: a hash boundary inside that very block (vLLM 0.33
    ``cache_partial_block``).  Nothing beyond the verified tokens is ever published."""
    pool = c.state.pool
    hbs = c.config.hash_block_size
    for gid, group in enumerate(c.state.groups):
        bs = c.config.groups[gid].block_size
        scale = bs // hbs
        for rid, table in group.req_to_blocks.items():
            cached = group.num_cached_block.get(rid, 0)
            if rid not in c.requests:
                return f"group {gid} holds a table for unknown request {rid!r}"
            view = c.view_hashes(rid, gid)
            fine = c.requests[rid].block_hashes
            for i, b in enumerate(table):
                if b == NULL_BLOCK_ID:
                    continue
                key, extras = pool.block_key[b], pool.secondary_keys.get(b, ())
                if extras or (key is not None and i >= cached):  # the hash boundaries inside the block
                    inside = {make_block_key(h, GroupId(gid)) for h in fine[i * scale : (i + 1) * scale - 1]}
                    if not inside.issuperset(extras):
                        return (
                            f"group {gid} request {rid!r} slot {i} (block {b}) has a secondary key "
                            "that is not a boundary inside it"
                        )
                if i >= cached:
                    if key is not None and key not in inside:
                        return (
                            f"group {gid} request {rid!r} slot {i} (block {b}) is hashed but not yet cached ({cached})"
                        )
                    continue
                if key is None:
                    if c.evict_called or _masked(c.config, gid, i):
                        continue
                    return (
                        f"group {gid} request {rid!r} slot {i} (block {b}) is below the cached count {cached} "
                        "but unhashed"
                    )
                if i >= len(view) or key != make_block_key(view[i], GroupId(gid)):
                    return (
                        f"group {gid} request {rid!r} slot {i} (block {b}) is hashed with a key "
                        f"that is not the request's hash {i}"
                    )
                if pool.block_key_tokens[b] not in (None, (i + 1) * bs):  # None: a target that does not say
                    return (
                        f"block {b} holds a full key but records {pool.block_key_tokens[b]} tokens, not {(i + 1) * bs}"
                    )
    return None


def _masked(config: KVCacheConfig, gid: int, index: int) -> bool:
    """Could vLLM 0.33's reachability mask have left slot ``index`` of this group unhashed?  A
    sliding-window hit needs only the last ``cdiv(W - 1, bs)`` blocks before an aligned boundary,
    so the other blocks of each ``scheduler_block_size`` segment are never published (with a
    1-token window, none is)."""
    spec = config.groups[gid]
    if spec.kind != "sliding_window" or spec.sliding_window is None:
        return False
    if config.scheduler_block_size % spec.block_size:
        return False
    per_segment = config.scheduler_block_size // spec.block_size
    need = -(-(spec.sliding_window - 1) // spec.block_size)
    return need < per_segment and index % per_segment < per_segment - need


@SPEC_INVARIANTS.register("§9.11", "state")
def cache_bounds(c: StateContext) -> str | None:
    """``num_cached_block`` never exceeds the table or the verified tokens (so drafts and lookahead
    slots are never cached), and every real block it covers lies within the request's hashes.
    Null placeholders adopted for window-skipped tokens count as cached without a hash (vLLM 0.33
    ``add_local_computed_blocks``), which with caching off is the only way the count grows."""
    hbs = c.config.hash_block_size
    for gid, group in enumerate(c.state.groups):
        bs = c.config.groups[gid].block_size
        for rid, n in group.num_cached_block.items():
            table = group.req_to_blocks.get(rid, ())
            req = c.requests.get(rid)
            if n > len(table):
                return f"group {gid} request {rid!r}: num_cached_block {n} > table length {len(table)}"
            if req is None:
                return f"group {gid}: num_cached_block for unknown request {rid!r}"
            if n * bs > req.num_tokens:
                return (
                    f"group {gid} request {rid!r}: num_cached_block {n} covers {n * bs} tokens "
                    f"> num_tokens {req.num_tokens}"
                )
            real = [i for i in range(n) if table[i] != NULL_BLOCK_ID]
            if real and (real[-1] + 1) * bs > len(req.block_hashes) * hbs:
                return (
                    f"group {gid} request {rid!r}: cached block at index {real[-1]} lies beyond its "
                    f"{len(req.block_hashes)} hashes x {hbs} tokens"
                )
    return None


@SPEC_INVARIANTS.register("§9.12", "state")
def hash_chain(c: StateContext) -> str | None:
    """Each request's hashes are exactly its full blocks' chained hashes (none when caching is off):
    ``len == num_tokens // hash_block_size``, each recomputed from its parent, tokens and extra keys
    under the release's hashing rules (``spec.request.recompute_block_hashes``)."""
    hbs = c.config.hash_block_size
    for rid, req in c.requests.items():
        expected_len = req.num_tokens // hbs if c.config.enable_caching else 0
        if len(req.block_hashes) != expected_len:
            return f"request {rid!r} has {len(req.block_hashes)} block hashes, expected {expected_len}"
        if expected_len and recompute_hashes(req, c.config.profile) != req.block_hashes:
            return f"request {rid!r} block hashes do not match a recomputation from its tokens"
    return None


@SPEC_INVARIANTS.register("§9.13", "state")
def table_length_bounded(c: StateContext) -> str | None:
    """No table is longer than ``cdiv(max_model_len, bs)`` blocks (cross-attention: the encoder
    input, which the spec does not bound)."""
    for gid, group in enumerate(c.state.groups):
        spec = c.config.groups[gid]
        if spec.kind == "cross":
            continue
        limit = -(-c.config.max_model_len // spec.block_size)
        for rid, table in group.req_to_blocks.items():
            if len(table) > limit:
                return f"group {gid} request {rid!r} holds {len(table)} blocks > cdiv(max_model_len, bs) = {limit}"
    return None


@SPEC_INVARIANTS.register("§9.14", "state")
def null_pattern(c: StateContext) -> str | None:
    """Full-attention and cross-attention tables hold no nulls: every position they read has a block."""
    for gid, group in enumerate(c.state.groups):
        kind = c.config.groups[gid].kind
        if kind not in ("full", "cross"):
            continue
        for rid, table in group.req_to_blocks.items():
            if NULL_BLOCK_ID in table:
                return f"{kind} group {gid} request {rid!r} has a null block: {list(table)}"
    return None


@SPEC_INVARIANTS.register("§9.14", "state", VLLM_POLICY)
def window_nulls_from_front(c: StateContext) -> str | None:
    """Sliding-window and chunked-local tables are a run of nulls followed by real blocks: vLLM 0.33
    (``SlidingWindowManager.remove_skipped_blocks``) only ever nulls positions from the front, and a
    prefix hit adopts no block the window has passed.  SGLang may leave a hole: a hit's old pages
    kept by the tree before pages its window dropped (docs/sglang.md)."""
    for gid, group in enumerate(c.state.groups):
        kind = c.config.groups[gid].kind
        if kind in ("full", "cross"):
            continue
        for rid, table in group.req_to_blocks.items():
            seen_real = False
            for b in table:
                if b != NULL_BLOCK_ID:
                    seen_real = True
                elif seen_real:
                    return f"{kind} group {gid} request {rid!r} has a null after a real block: {list(table)}"
    return None


@SPEC_INVARIANTS.register("§9.15", "state")
def dict_membership(c: StateContext) -> str | None:
    """Every request with a cached count has a table, and every table belongs to a live request."""
    for gid, group in enumerate(c.state.groups):
        extra = set(group.num_cached_block) - set(group.req_to_blocks)
        if extra:
            return f"group {gid}: num_cached_block for request(s) {sorted(extra)} without a table"
        unknown = set(group.req_to_blocks) - set(c.requests)
        if unknown:
            return f"group {gid}: table(s) for request(s) {sorted(unknown)} that are no longer live"
    return None


@SPEC_INVARIANTS.register("§9.16", "state", VLLM_POLICY)
def free_queue_partition(c: StateContext) -> str | None:
    """vLLM 0.33 order: unhashed free blocks are prepended and hashed ones appended, and a queued
    block's hash never changes, so (unless ``evict_blocks`` ran) every unhashed block in the queue
    comes before every hashed one.  Not so where a profile appends unhashed blocks too (the 0.20
    ``free_order``; 0.23's ``finish_free_order``)."""
    pool = c.state.pool
    profile = pool.profile
    if profile.free_order != "split" or profile.finish_free_order != "split":
        return None
    if c.evict_called or not pool.enable_caching:
        return None
    seen_hashed = None
    for b in pool.free_queue:
        if pool.block_key[b] is not None:
            seen_hashed = b
        elif seen_hashed is not None:
            return f"unhashed block {b} follows hashed block {seen_hashed} in the free queue"
    return None


@SPEC_INVARIANTS.register("§9.20", "state", VLLM_POLICY)
def events_rebuild_hash_map(c: StateContext) -> str | None:
    """With events on, replaying every event (taken and pending) rebuilds the hash map: each key
    is stored as many times as blocks hold it.  Events name a key by the request hash it ends with
    (``spec.hashing.get_published_hash``: the key's hash itself, or before vLLM 0.24 the last fine
    hash of a concatenated key)."""
    if not c.config.enable_kv_cache_events or c.event_log is None:
        return None
    counts = replay(c.state.pool.events, Counter(taken_counts(c.event_log)))
    replayed = {k: n for k, n in counts.items() if n != 0}
    actual: Counter[BlockKey] = Counter()
    for k, v in c.state.pool.cached.items():
        actual[make_block_key(get_published_hash(get_block_hash(k)), get_group_id(k))] += len(v)
    if replayed != dict(actual):
        missing = set(actual) - set(replayed)
        extra = set(replayed) - set(actual)
        return (
            f"events replay to {len(replayed)} keys, map holds {len(actual)} "
            f"({len(missing)} unannounced, {len(extra)} stale)"
        )
    return None


def _short(key: bytes | None) -> str:
    return "no key" if key is None else key.hex()[:16]
