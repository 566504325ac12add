"""Step invariants: postconditions of one manager operation over a ``StepContext``
(docs/semantics.md P1-P7 and the per-operation rules §9.11, §9.14, §9.17-§9.19).

Each returns ``None`` when its rule holds, or a message naming the witness.  Every one states vLLM's
policy (``VLLM_POLICY``: what its manager calls do, e.g. "``cache_blocks`` changes no ref count",
"``free`` changes no hash"), so none is checked on another engine.
"""

from __future__ import annotations

from collections import Counter

from kvspec.spec.invariants.registry import SPEC_INVARIANTS, VLLM_POLICY, StepContext
from kvspec.spec.kv_cache_manager import get_max_cache_hit_length, is_prefix_cache_lookup_enabled
from kvspec.spec.linked_queue import queue_push
from kvspec.spec.persistent import vec_changed, vec_set
from kvspec.spec.types import NULL_BLOCK_ID, BlockId, GroupId, make_block_key

# --- operation postconditions ----------------------------------------------------------------------


@SPEC_INVARIANTS.register("P1", "step", VLLM_POLICY)
def lookup_is_pure_and_bounded(s: StepContext) -> str | None:
    """``get_computed_blocks`` changes nothing; its hit is a multiple of the hit alignment (the
    LCM for a hybrid), below ``num_tokens``, and every group's list covers exactly it (no list
    for a hit of 0)."""
    if s.op != "get_computed_blocks":
        return None
    if s.before != s.after:
        return "get_computed_blocks changed the state"
    req = s.request
    assert req is not None
    hit = s.outcome.num_hit_tokens
    config = s.before.config
    if hit and hit % config.scheduler_block_size != 0:
        return f"hit {hit} is not a multiple of {config.scheduler_block_size}"
    if hit > max(0, req.num_tokens - 1):
        return f"hit {hit} reaches num_tokens {req.num_tokens} (at least one token must be recomputed)"
    for gid, blocks in enumerate(s.outcome.blocks):
        spec = config.groups[gid]
        if spec.is_prefix_cacheable and len(blocks) * spec.block_size != hit:
            return f"group {gid} returned {len(blocks)} blocks for a {hit}-token hit"
    return None


@SPEC_INVARIANTS.register("P1", "step", VLLM_POLICY)
def full_attention_hit_is_maximal(s: StepContext) -> str | None:
    """One full-attention group: hit block i is the oldest block under the request's hash i, and
    the hit stops only at a miss or at the cap (alignment = block size)."""
    config = s.before.config
    if s.op != "get_computed_blocks" or len(config.groups) != 1 or config.groups[0].kind != "full":
        return None
    req = s.request
    assert req is not None
    if not is_prefix_cache_lookup_enabled(s.before, req):
        return None if s.outcome.num_hit_tokens == 0 else "hit with lookup disabled"
    bs = config.groups[0].block_size
    blocks = s.outcome.blocks[0]
    for i, b in enumerate(blocks):
        holders = s.before.pool.cached.get(make_block_key(req.block_hashes[i], GroupId(0)), ())
        if not holders or holders[0] != b:
            return f"hit block {i} is {b}, but the oldest block under the request's hash {i} is {holders[:1]}"
    n = len(blocks)
    cap_blocks = max(0, get_max_cache_hit_length(s.before, req)) // bs
    if n < cap_blocks and make_block_key(req.block_hashes[n], GroupId(0)) in s.before.pool.cached:
        return f"hit stops at {n} blocks although block {n} is cached and the cap allows {cap_blocks}"
    return None


@SPEC_INVARIANTS.register("P2", "step", VLLM_POLICY)
def failed_allocation_changes_nothing(s: StepContext) -> str | None:
    """``allocate_slots`` -> None: no ref count grows, the free count does not drop, tables change
    only by nulling out-of-window blocks, and nothing new is hashed."""
    if s.op != "allocate_slots" or s.outcome is not None:
        return None
    b, a = s.before, s.after
    # Only the blocks whose count or key changed are read (``vec_changed``: whole vectors compared
    # first, then the chunks they do not share).
    for blk in sorted({*vec_changed(b.pool.ref_cnt, a.pool.ref_cnt), *vec_changed(b.pool.block_key, a.pool.block_key)}):
        if blk == NULL_BLOCK_ID:
            continue
        if a.pool.ref_cnt[blk] > b.pool.ref_cnt[blk]:
            return f"block {blk} gained a reference in a failed allocation"
        if a.pool.block_key[blk] is not None and b.pool.block_key[blk] is None:
            return f"block {blk} was hashed in a failed allocation"
    if len(a.pool.free_queue) < len(b.pool.free_queue):
        return "a failed allocation took free blocks"
    for gid, (gb, ga) in enumerate(zip(b.groups, a.groups)):
        for rid, table in ga.req_to_blocks.items():
            old = gb.req_to_blocks.get(rid, ())
            if len(table) != len(old) or any(x != y and x != NULL_BLOCK_ID for x, y in zip(table, old)):
                return (
                    f"group {gid} request {rid!r} table changed from {list(old)} to {list(table)} "
                    "in a failed allocation"
                )
        if ga.num_cached_block != gb.num_cached_block:
            return f"group {gid} num_cached_block changed in a failed allocation"
    return None


@SPEC_INVARIANTS.register("P3 §9.18", "step", VLLM_POLICY)
def successful_allocation_is_exact(s: StepContext) -> str | None:
    """``allocate_slots`` -> blocks (and §9.13, §9.18): each attention table ends exactly ``max(previous length,
    cdiv(need_slot, bs))`` long, where ``need_slot = min(computed + new_computed + external + new
    + lookahead, max_model_len)``; the returned blocks are the table's fresh tail, each newly
    taken from the free queue with one reference."""
    if s.op != "allocate_slots" or s.outcome is None:
        return None
    req = s.request
    assert req is not None
    a, b = s.args, s.before
    config = b.config
    need_slot = min(
        req.num_computed_tokens
        + a.get("num_new_computed_tokens", 0)
        + a.get("num_external_computed_tokens", 0)
        + a["num_new_tokens"]
        + a.get("num_lookahead_tokens", 0),
        config.max_model_len,
    )
    # Fresh blocks come from the free queue, which this very call may have refilled first by
    # releasing the request's own out-of-window blocks (step 5 runs before allocating).  A block
    # is in the free queue exactly when it is unreferenced (§9.3, checked on every full state), so
    # "free before" is read from its count, not by building the queue's set (cost flat in the pool).
    released: set[BlockId] = set()
    for gid in range(len(config.groups)):
        old_table = b.groups[gid].req_to_blocks.get(req.request_id, ())
        new_table = s.after.groups[gid].req_to_blocks.get(req.request_id, ())
        released.update(x for x, y in zip(old_table, new_table) if y == NULL_BLOCK_ID)
    for gid, spec in enumerate(config.groups):
        tokens = a.get("num_encoder_tokens", 0) if spec.kind == "cross" else need_slot
        table = s.after.groups[gid].req_to_blocks.get(req.request_id, ())
        old = len(b.groups[gid].req_to_blocks.get(req.request_id, ()))
        expected = max(old, -(-tokens // spec.block_size))
        if spec.kind != "cross" and a.get("new_computed_blocks") is not None:
            expected = max(expected, len(a["new_computed_blocks"].blocks[gid]))
        if len(table) != expected:
            return f"group {gid}: table has {len(table)} blocks, expected max({old}, cdiv({tokens}, {spec.block_size}))"
        fresh = tuple(s.outcome[gid])
        if fresh and tuple(table[len(table) - len(fresh) :]) != fresh:
            return f"group {gid}: returned blocks {list(fresh)} are not the table's tail {list(table)}"
        for blk in fresh:
            free_before = blk in released or (blk != NULL_BLOCK_ID and b.pool.ref_cnt[blk] == 0)
            if not free_before or s.after.pool.ref_cnt[blk] != 1:
                return (
                    f"group {gid}: returned block {blk} was not free before or has ref_cnt {s.after.pool.ref_cnt[blk]}"
                )
    return None


@SPEC_INVARIANTS.register("P6", "step", VLLM_POLICY)
def hits_are_adopted(s: StepContext) -> str | None:
    """A successful first admission with prefix hits adopts each hit at its own index, touched
    (``ref_cnt >= 1``), unless the window had already passed it (then the slot is null and the
    block was left untouched, hence still evictable)."""
    if s.op != "allocate_slots" or s.outcome is None or s.args.get("new_computed_blocks") is None:
        return None
    req = s.request
    assert req is not None
    if any(req.request_id in g.num_cached_block for g in s.before.groups):
        return None  # a running request adopts nothing
    for gid, hits in enumerate(s.args["new_computed_blocks"].blocks):
        table = s.after.groups[gid].req_to_blocks.get(req.request_id, ())
        for i, blk in enumerate(hits):
            if blk == NULL_BLOCK_ID:
                continue
            if i >= len(table) or table[i] not in (blk, NULL_BLOCK_ID):
                return f"group {gid}: hit block {blk} is not at index {i} of the table {list(table)}"
            if table[i] == blk and s.after.pool.ref_cnt[blk] < 1:
                return f"group {gid}: adopted hit block {blk} has ref_cnt {s.after.pool.ref_cnt[blk]}"
    return None


@SPEC_INVARIANTS.register("P4", "step", VLLM_POLICY)
def free_releases_everything(s: StepContext) -> str | None:
    """``free(r)``: each distinct block of r loses exactly one reference, blocks reaching 0 join
    the queue, hashes are kept, and r is gone from every group."""
    if s.op != "free":
        return None
    rid = s.args["request_id"]
    held: Counter[BlockId] = Counter()
    for g in s.before.groups:
        held.update(blk for blk in g.req_to_blocks.get(rid, ()) if blk != NULL_BLOCK_ID)
    # The expected counts built by writing only the request's blocks, then compared whole.
    before = s.before.pool
    expected = vec_set(before.ref_cnt, {blk: before.ref_cnt[blk] - n for blk, n in held.items()})
    after = s.after.pool
    wrong = [x for x in vec_changed(expected, after.ref_cnt) if x != NULL_BLOCK_ID]
    if wrong:
        x = wrong[0]
        return f"block {x}: ref_cnt {after.ref_cnt[x]} after free, expected {expected[x]}"
    rehashed = [x for x in vec_changed(before.block_key, after.block_key) if x != NULL_BLOCK_ID]
    if rehashed:
        return f"block {rehashed[0]}: free changed its hash"
    for gid, g in enumerate(s.after.groups):
        if rid in g.req_to_blocks or rid in g.num_cached_block:
            return f"group {gid} still tracks freed request {rid!r}"
    return None


@SPEC_INVARIANTS.register("P4 §9.17", "step", VLLM_POLICY)
def free_order(s: StepContext) -> str | None:
    """``free(r)`` (and §9.17, LRU order) queues, group by group and tail first, the blocks reaching 0: in vLLM 0.33 the
    unhashed ones go to the front (the last group's first) and the hashed ones to the tail.  All go
    to the tail in the 0.20 profile, with caching off in 0.27.x, and in 0.23 for groups other than
    sliding window (the profile's ``free_order``, ``caching_off_free_order``, ``finish_free_order``)."""
    if s.op != "free":
        return None
    rid = s.args["request_id"]
    config = s.before.config
    profile = config.profile
    splits = profile.free_order == "split" and (config.enable_caching or profile.caching_off_free_order == "front")
    ref: dict[BlockId, int] = {}  # the counts of the request's blocks as the free proceeds
    front: list[BlockId] = []
    tail: list[BlockId] = []
    for gid, g in enumerate(s.before.groups):
        group_splits = splits and (profile.finish_free_order == "split" or config.groups[gid].kind == "sliding_window")
        group_front = []
        for blk in reversed(g.req_to_blocks.get(rid, ())):
            if blk == NULL_BLOCK_ID:
                continue
            ref[blk] = ref.get(blk, s.before.pool.ref_cnt[blk]) - 1
            if ref[blk] == 0:
                hashed = s.before.pool.block_key[blk] is not None and config.enable_caching
                if hashed or not group_splits:
                    tail.append(blk)
                else:
                    group_front.append(blk)
        front = group_front + front
    try:
        expected = queue_push(s.before.pool.free_queue, front, tail)
    except AssertionError:  # a block already queued: a linked queue cannot hold it twice, a tuple can
        expected = (*front, *s.before.pool.free_queue, *tail)
    if s.after.pool.free_queue != expected:
        return f"free queue after free is {list(s.after.pool.free_queue)}, expected {list(expected)}"
    return None


@SPEC_INVARIANTS.register("P5", "step", VLLM_POLICY)
def cache_blocks_publishes_full_blocks(s: StepContext) -> str | None:
    """``cache_blocks``: no ref count or queue change; cached counts only grow; blocks only gain
    hashes, never lose them (a partial entry is replaced by the block's full key)."""
    if s.op != "cache_blocks":
        return None
    b, a = s.before, s.after
    if a.pool.ref_cnt != b.pool.ref_cnt or a.pool.free_queue != b.pool.free_queue:
        return "cache_blocks changed ref counts or the free queue"
    for blk in vec_changed(b.pool.block_key, a.pool.block_key):
        if blk == NULL_BLOCK_ID:
            continue
        old, new = b.pool.block_key[blk], a.pool.block_key[blk]
        if old is not None and new != old:
            # Only a partial entry may give way, to the longer (full) key of the same block.
            grew = (b.pool.block_key_tokens[blk] or 0) < (a.pool.block_key_tokens[blk] or 0)
            if new is None or not grew:
                return f"cache_blocks changed the hash of block {blk}"
    for gid, (gb, ga) in enumerate(zip(b.groups, a.groups)):
        for rid, n in gb.num_cached_block.items():
            if ga.num_cached_block.get(rid, 0) < n:
                return f"group {gid} request {rid!r}: num_cached_block fell from {n}"
    return None


@SPEC_INVARIANTS.register("§9.11", "step", VLLM_POLICY)
def cached_count_never_decreases(s: StepContext) -> str | None:
    """While a request holds its table, its ``num_cached_block`` never decreases and its table
    never shrinks (§9.13); only ``free`` forgets both."""
    if s.op == "free":
        return None
    for gid, (gb, ga) in enumerate(zip(s.before.groups, s.after.groups)):
        for rid, n in gb.num_cached_block.items():
            if ga.num_cached_block.get(rid, 0) < n:
                return (
                    f"group {gid} request {rid!r}: num_cached_block fell from {n} to {ga.num_cached_block.get(rid, 0)}"
                )
        for rid, table in gb.req_to_blocks.items():
            if len(ga.req_to_blocks.get(rid, ())) < len(table):
                return f"group {gid} request {rid!r}: table shrank from {len(table)} blocks"
    return None


@SPEC_INVARIANTS.register("§9.14", "step", VLLM_POLICY)
def window_blocks_released(s: StepContext) -> str | None:
    """After ``remove_skipped_blocks(p)`` (or ``allocate_slots``, which runs it first), no real
    block lies wholly before the attention span of the next query: for sliding window W the first
    ``floor(max(0, p - W + 1) / bs)`` positions, for chunked local C the first ``floor(p // C * C / bs)``,
    are null (capped at the table length)."""
    if s.op not in ("remove_skipped_blocks", "allocate_slots"):
        return None
    if s.op == "remove_skipped_blocks":
        rid, processed = s.args["request_id"], s.args["num_computed_tokens"]
    else:
        req = s.request
        assert req is not None
        rid = req.request_id
        total = min(
            req.num_computed_tokens
            + s.args.get("num_new_computed_tokens", 0)
            + s.args.get("num_external_computed_tokens", 0),
            s.before.config.max_model_len,
        )
        # Tokens still in flight (async scheduling) may yet be read: the processed basis (§3.1).
        processed = max(0, total - req.num_in_flight_tokens)
    for gid, spec in enumerate(s.before.config.groups):
        if spec.kind == "sliding_window":
            assert spec.sliding_window is not None
            skipped = max(0, processed - spec.sliding_window + 1)
        elif spec.kind == "chunked_local":
            assert spec.attention_chunk_size is not None
            skipped = processed // spec.attention_chunk_size * spec.attention_chunk_size
        else:
            continue
        before_len = len(s.before.groups[gid].req_to_blocks.get(rid, ()))
        table = s.after.groups[gid].req_to_blocks.get(rid, ())
        must_be_null = min(skipped // spec.block_size, before_len)
        live = [i for i in range(must_be_null) if table[i] != NULL_BLOCK_ID]
        if live:
            return (
                f"group {gid} request {rid!r}: positions {live} are out of the window ({processed} processed) "
                f"but still hold blocks {list(table)}"
            )
    return None


@SPEC_INVARIANTS.register("P7", "step", VLLM_POLICY)
def evict_only_touches_hashes(s: StepContext) -> str | None:
    """``evict_blocks`` (P7): only hashes and map entries change; the named blocks end unhashed."""
    if s.op != "evict_blocks":
        return None
    b, a = s.before, s.after
    if a.pool.ref_cnt != b.pool.ref_cnt or a.pool.free_queue != b.pool.free_queue or a.groups != b.groups:
        return "evict_blocks changed ref counts, the free queue or tables"
    for blk in s.args["block_ids"]:
        if a.pool.block_key[blk] is not None:
            return f"block {blk} is still hashed after evict_blocks"
    return None


@SPEC_INVARIANTS.register("§9.19", "step", VLLM_POLICY)
def reset_only_when_all_free(s: StepContext) -> str | None:
    """``reset_prefix_cache`` succeeds iff every usable block is free; success clears every hash
    and keeps the queue order; failure changes nothing."""
    if s.op != "reset_prefix_cache":
        return None
    b, a = s.before, s.after
    all_free = len(b.pool.free_queue) == b.pool.num_blocks - 1
    if s.outcome != all_free:
        return f"reset returned {s.outcome} with {len(b.pool.free_queue)} of {b.pool.num_blocks - 1} blocks free"
    if not s.outcome:
        return None if a == b else "a refused reset changed the state"
    if a.pool.cached or any(k is not None for k in a.pool.block_key):
        return "hashes survive a successful reset"
    if a.pool.free_queue != b.pool.free_queue:
        return "a successful reset reordered the free queue"
    return None
