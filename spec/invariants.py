"""Every invariant of the manager as a named predicate, in one registry.

Each predicate cites its rule in ``/work/shared/reference/vllm-kv-semantics.md`` section 9
("§9.n" for the numbered invariants, "P1".."P7" for the operation postconditions) and returns
``None`` when it holds or a message naming the witness when it does not.  Two kinds:

- **state** predicates look at one state (plus the requests, whose hashes the tables must match);
- **step** predicates look at one operation: the state before and after, the call and its outcome.

``check_invariants`` and ``check_step`` run every predicate of a kind and return the violations,
each carrying the predicate's name, so the harness can stop with ``"§9.5 ref_count_equals_references:
block 7 has ref_cnt 2 but 1 reference"``.  Predicates are deliberately a second reading of the
rules, written from the document rather than from the operations in ``spec/``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from spec.config import KVCacheConfig, Profile
from spec.events import AllBlocksCleared, BlockRemoved, BlockStored, Event
from spec.hashing import extend_block_hashes
from spec.request import PROCESS_HASH_SEED, Request
from spec.state import KVCacheManagerState
from spec.types import NULL_BLOCK_ID, BlockHash, BlockId, BlockKey, GroupId, RequestId, get_group_id, make_block_key

# --- contexts ------------------------------------------------------------------------------------


@dataclass
class StateContext:
    """One state to check.  ``evict_called``: ``evict_blocks`` ran at some point (it legitimately
    strips hashes from blocks still in use, which relaxes §9.8, §9.10 and §9.16).  ``event_log``:
    every event taken so far (``None`` when the caller does not track them), for §9.20."""

    state: KVCacheManagerState
    requests: Mapping[RequestId, Request]
    evict_called: bool = False
    event_log: Sequence[Event] | None = None

    @property
    def config(self) -> KVCacheConfig:
        return self.state.config

    @cached_property
    def references(self) -> dict[BlockId, list[tuple[GroupId, RequestId, int]]]:
        """Non-null block -> every table slot (group, request, index) that holds it."""
        refs: dict[BlockId, list[tuple[GroupId, RequestId, int]]] = {}
        for gid, group in enumerate(self.state.groups):
            for rid, table in group.req_to_blocks.items():
                for i, b in enumerate(table):
                    if b != NULL_BLOCK_ID:
                        refs.setdefault(b, []).append((GroupId(gid), rid, i))
        return refs

    @cached_property
    def free_set(self) -> set[BlockId]:
        return set(self.state.pool.free_queue)

    def view_hashes(self, rid: RequestId, gid: int) -> Sequence[BlockHash]:
        """``H_g(r)``: the request's hashes seen at group g's block size (last fine hash)."""
        hashes = self.requests[rid].block_hashes
        scale = self.config.groups[gid].block_size // self.config.hash_block_size
        return hashes if scale == 1 else hashes[scale - 1 :: scale]


@dataclass
class StepContext:
    """One manager operation: ``op`` is the operation's name in ``spec.kv_cache_manager``
    (``get_computed_blocks``, ``allocate_slots``, ``free``, ``cache_blocks``,
    ``remove_skipped_blocks``, ``evict_blocks``, ``reset_prefix_cache``, ``take_events``), ``args``
    its keyword arguments, ``request`` the request passed (if any)."""

    before: KVCacheManagerState
    after: KVCacheManagerState
    op: str
    args: Mapping[str, Any]
    outcome: Any
    request: Request | None = None
    evict_called: bool = False


@dataclass(frozen=True)
class Violation:
    name: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.rule} {self.name}: {self.message}"


@dataclass(frozen=True)
class Invariant:
    name: str
    rule: str
    kind: Literal["state", "step"]
    check: Callable[[Any], str | None] = field(repr=False)

    @property
    def doc(self) -> str:
        return (self.check.__doc__ or "").strip()


INVARIANTS: dict[str, Invariant] = {}


def invariant(
    rule: str, kind: Literal["state", "step"] = "state"
) -> Callable[[Callable[[Any], str | None]], Callable[[Any], str | None]]:
    def register(fn: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
        assert fn.__name__ not in INVARIANTS, f"duplicate invariant {fn.__name__}"
        INVARIANTS[fn.__name__] = Invariant(fn.__name__, rule, kind, fn)
        return fn

    return register


# --- pool and free queue ---------------------------------------------------------------------------


@invariant("§9.1")
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


@invariant("§9.2")
def free_queue_well_formed(c: StateContext) -> str | None:
    """The free queue holds distinct real block ids, each in ``[1, num_blocks)``."""
    queue = c.state.pool.free_queue
    if len(c.free_set) != len(queue):
        dup = [b for b, n in Counter(queue).items() if n > 1]
        return f"block(s) {dup} appear more than once in the free queue"
    bad = [b for b in queue if not 0 < b < c.state.pool.num_blocks]
    return f"free queue holds invalid id(s) {bad}" if bad else None


@invariant("§9.3")
def free_iff_unreferenced(c: StateContext) -> str | None:
    """For every real block: in the free queue exactly when ``ref_cnt == 0``; never negative."""
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


@invariant("§9.4")
def conservation(c: StateContext) -> str | None:
    """``free + |{b real : ref_cnt(b) > 0}| == num_blocks - 1``: no block is lost or counted twice."""
    pool = c.state.pool
    used = sum(1 for b in range(1, pool.num_blocks) if pool.ref_cnt[b] > 0)
    if len(pool.free_queue) + used != pool.num_blocks - 1:
        return f"{len(pool.free_queue)} free + {used} in use != {pool.num_blocks - 1} usable blocks"
    return None


@invariant("§9.5")
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


@invariant("§9.6")
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


@invariant("§9.7")
def no_duplicate_in_table(c: StateContext) -> str | None:
    """Within one table a real block appears at most once."""
    for gid, group in enumerate(c.state.groups):
        for rid, table in group.req_to_blocks.items():
            real = [b for b in table if b != NULL_BLOCK_ID]
            if len(set(real)) != len(real):
                dup = [b for b, n in Counter(real).items() if n > 1]
                return f"group {gid} request {rid!r} holds block(s) {dup} twice: {list(table)}"
    return None


@invariant("§9.8")
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
            return f"block {b} is shared at index {i} by requests with different (or missing) hashes {[r for _, r, _ in refs]}"
    return None


@invariant("§9.9")
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


@invariant("§9.10")
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
                key = pool.block_key[b]
                inside = {make_block_key(h, GroupId(gid)) for h in fine[i * scale : (i + 1) * scale - 1]}
                for extra in pool.secondary_keys.get(b, ()):
                    if extra not in inside:
                        return f"group {gid} request {rid!r} slot {i} (block {b}) has a secondary key that is not a boundary inside it"
                if i >= cached:
                    if key is not None and key not in inside:
                        return (
                            f"group {gid} request {rid!r} slot {i} (block {b}) is hashed but not yet cached ({cached})"
                        )
                    continue
                if key is None:
                    if c.evict_called or _masked(c.config, gid, i):
                        continue
                    return f"group {gid} request {rid!r} slot {i} (block {b}) is below the cached count {cached} but unhashed"
                if i >= len(view) or key != make_block_key(view[i], GroupId(gid)):
                    return f"group {gid} request {rid!r} slot {i} (block {b}) is hashed with a key that is not the request's hash {i}"
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


@invariant("§9.11")
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
                return f"group {gid} request {rid!r}: num_cached_block {n} covers {n * bs} tokens > num_tokens {req.num_tokens}"
            real = [i for i in range(n) if table[i] != NULL_BLOCK_ID]
            if real and (real[-1] + 1) * bs > len(req.block_hashes) * hbs:
                return (
                    f"group {gid} request {rid!r}: cached block at index {real[-1]} lies beyond its "
                    f"{len(req.block_hashes)} hashes x {hbs} tokens"
                )
    return None


@invariant("§9.12")
def hash_chain(c: StateContext) -> str | None:
    """Each request's hashes are exactly its full blocks' chained hashes (none when caching is off):
    ``len == num_tokens // hash_block_size``, each recomputed from its parent, tokens and extra keys."""
    hbs = c.config.hash_block_size
    for rid, req in c.requests.items():
        expected_len = req.num_tokens // hbs if c.config.enable_caching else 0
        if len(req.block_hashes) != expected_len:
            return f"request {rid!r} has {len(req.block_hashes)} block hashes, expected {expected_len}"
        if expected_len and _recompute_hashes(req) != req.block_hashes:
            return f"request {rid!r} block hashes do not match a recomputation from its tokens"
    return None


_HASH_MEMO: dict[tuple[Any, ...], tuple[BlockHash, ...]] = {}


def _recompute_hashes(req: Request) -> tuple[BlockHash, ...]:
    memo_key = (req.all_token_ids, req.features, req.hash_block_size, req.hash_algo)
    hashes = _HASH_MEMO.get(memo_key)
    if hashes is None:
        if len(_HASH_MEMO) > 4096:
            _HASH_MEMO.clear()
        hashes = extend_block_hashes(
            (), req.all_token_ids, req.features, req.hash_block_size, req.hash_algo, PROCESS_HASH_SEED
        )
        _HASH_MEMO[memo_key] = hashes
    return hashes


@invariant("§9.13")
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


@invariant("§9.14")
def null_pattern(c: StateContext) -> str | None:
    """Full-attention tables hold no nulls; sliding-window and chunked-local tables are a run of
    nulls followed by real blocks (positions are only ever nulled from the front)."""
    for gid, group in enumerate(c.state.groups):
        kind = c.config.groups[gid].kind
        for rid, table in group.req_to_blocks.items():
            if kind in ("full", "cross"):
                if NULL_BLOCK_ID in table:
                    return f"{kind} group {gid} request {rid!r} has a null block: {list(table)}"
                continue
            seen_real = False
            for b in table:
                if b != NULL_BLOCK_ID:
                    seen_real = True
                elif seen_real:
                    return f"{kind} group {gid} request {rid!r} has a null after a real block: {list(table)}"
    return None


@invariant("§9.15")
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


@invariant("§9.16")
def free_queue_partition(c: StateContext) -> str | None:
    """vLLM 0.33 order: unhashed free blocks are prepended and hashed ones appended, and a queued
    block's hash never changes, so (unless ``evict_blocks`` ran) every unhashed block in the queue
    comes before every hashed one."""
    pool = c.state.pool
    if pool.profile is not Profile.V0_33 or c.evict_called or not pool.enable_caching:
        return None
    seen_hashed = None
    for b in pool.free_queue:
        if pool.block_key[b] is not None:
            seen_hashed = b
        elif seen_hashed is not None:
            return f"unhashed block {b} follows hashed block {seen_hashed} in the free queue"
    return None


@invariant("§9.20")
def events_rebuild_hash_map(c: StateContext) -> str | None:
    """With events on, replaying every event (taken and pending) rebuilds the hash map: each key
    is stored as many times as blocks hold it."""
    if not c.config.enable_kv_cache_events or c.event_log is None:
        return None
    counts: Counter[BlockKey] = Counter()
    for e in list(c.event_log) + list(c.state.pool.events):
        if isinstance(e, AllBlocksCleared):
            counts.clear()
        elif isinstance(e, BlockStored):
            for h in e.block_hashes:
                counts[make_block_key(h, e.group_id)] += 1
        elif isinstance(e, BlockRemoved):
            for h in e.block_hashes:
                counts[make_block_key(h, e.group_id)] -= 1
    replayed = {k: n for k, n in counts.items() if n != 0}
    actual = {k: len(v) for k, v in c.state.pool.cached.items()}
    if replayed != actual:
        missing = set(actual) - set(replayed)
        extra = set(replayed) - set(actual)
        return f"events replay to {len(replayed)} keys, map holds {len(actual)} ({len(missing)} unannounced, {len(extra)} stale)"
    return None


# --- operation postconditions ----------------------------------------------------------------------


@invariant("P1", "step")
def lookup_is_pure_and_bounded(s: StepContext) -> str | None:
    """``get_computed_blocks`` changes nothing; its hit is a multiple of the hit alignment (the
    LCM for a hybrid), below ``num_tokens``, and every group's list covers it."""
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
        if spec.is_prefix_cacheable and hit and len(blocks) * spec.block_size != hit:
            return f"group {gid} returned {len(blocks)} blocks for a {hit}-token hit"
    return None


@invariant("P1", "step")
def full_attention_hit_is_maximal(s: StepContext) -> str | None:
    """One full-attention group: hit block i is the oldest block under the request's hash i, and
    the hit stops only at a miss or at the cap (alignment = block size)."""
    config = s.before.config
    if s.op != "get_computed_blocks" or len(config.groups) != 1 or config.groups[0].kind != "full":
        return None
    req = s.request
    assert req is not None
    if not config.enable_caching or req.skip_reading_prefix_cache:
        return None if s.outcome.num_hit_tokens == 0 else "hit with lookup disabled"
    bs = config.groups[0].block_size
    blocks = s.outcome.blocks[0]
    for i, b in enumerate(blocks):
        holders = s.before.pool.cached.get(make_block_key(req.block_hashes[i], GroupId(0)), ())
        if not holders or holders[0] != b:
            return f"hit block {i} is {b}, but the oldest block under the request's hash {i} is {holders[:1]}"
    n = len(blocks)
    cap_blocks = max(0, req.num_tokens - 1) // bs
    if n < cap_blocks and make_block_key(req.block_hashes[n], GroupId(0)) in s.before.pool.cached:
        return f"hit stops at {n} blocks although block {n} is cached and the cap allows {cap_blocks}"
    return None


@invariant("P2", "step")
def failed_allocation_changes_nothing(s: StepContext) -> str | None:
    """``allocate_slots`` -> None: no ref count grows, the free count does not drop, tables change
    only by nulling out-of-window blocks, and nothing new is hashed."""
    if s.op != "allocate_slots" or s.outcome is not None:
        return None
    b, a = s.before, s.after
    for blk in range(1, b.pool.num_blocks):
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
                return f"group {gid} request {rid!r} table changed from {list(old)} to {list(table)} in a failed allocation"
        if ga.num_cached_block != gb.num_cached_block:
            return f"group {gid} num_cached_block changed in a failed allocation"
    return None


@invariant("P3 §9.18", "step")
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
    # releasing the request's own out-of-window blocks (step 5 runs before allocating).
    free_before = set(b.pool.free_queue)
    for gid in range(len(config.groups)):
        old_table = b.groups[gid].req_to_blocks.get(req.request_id, ())
        new_table = s.after.groups[gid].req_to_blocks.get(req.request_id, ())
        free_before.update(x for x, y in zip(old_table, new_table) if y == NULL_BLOCK_ID)
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
            if blk not in free_before or s.after.pool.ref_cnt[blk] != 1:
                return (
                    f"group {gid}: returned block {blk} was not free before or has ref_cnt {s.after.pool.ref_cnt[blk]}"
                )
    return None


@invariant("P6", "step")
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


@invariant("P4", "step")
def free_releases_everything(s: StepContext) -> str | None:
    """``free(r)``: each distinct block of r loses exactly one reference, blocks reaching 0 join
    the queue, hashes are kept, and r is gone from every group."""
    if s.op != "free":
        return None
    rid = s.args["request_id"]
    held: Counter[BlockId] = Counter()
    for g in s.before.groups:
        held.update(blk for blk in g.req_to_blocks.get(rid, ()) if blk != NULL_BLOCK_ID)
    for blk in range(1, s.before.pool.num_blocks):
        expect = s.before.pool.ref_cnt[blk] - held.get(BlockId(blk), 0)
        if s.after.pool.ref_cnt[blk] != expect:
            return f"block {blk}: ref_cnt {s.after.pool.ref_cnt[blk]} after free, expected {expect}"
        if s.after.pool.block_key[blk] != s.before.pool.block_key[blk]:
            return f"block {blk}: free changed its hash"
    for gid, g in enumerate(s.after.groups):
        if rid in g.req_to_blocks or rid in g.num_cached_block:
            return f"group {gid} still tracks freed request {rid!r}"
    return None


@invariant("P4 §9.17", "step")
def free_order(s: StepContext) -> str | None:
    """``free(r)`` (and §9.17, LRU order) queues, group by group and tail first, the blocks reaching 0: in vLLM 0.33 the
    unhashed ones go to the front (the last group's first) and the hashed ones to the tail; in
    the 0.20 profile all go to the tail."""
    if s.op != "free":
        return None
    rid = s.args["request_id"]
    ref = list(s.before.pool.ref_cnt)
    front: list[BlockId] = []
    tail: list[BlockId] = []
    for g in s.before.groups:
        group_front = []
        for blk in reversed(g.req_to_blocks.get(rid, ())):
            if blk == NULL_BLOCK_ID:
                continue
            ref[blk] -= 1
            if ref[blk] == 0:
                hashed = s.before.pool.block_key[blk] is not None and s.before.config.enable_caching
                if hashed or s.before.config.profile is Profile.V0_20:
                    tail.append(blk)
                else:
                    group_front.append(blk)
        front = group_front + front
    expected = tuple(front) + s.before.pool.free_queue + tuple(tail)
    if s.after.pool.free_queue != expected:
        return f"free queue after free is {list(s.after.pool.free_queue)}, expected {list(expected)}"
    return None


@invariant("P5", "step")
def cache_blocks_publishes_full_blocks(s: StepContext) -> str | None:
    """``cache_blocks``: no ref count or queue change; cached counts only grow; blocks only gain
    hashes, never lose them (a partial entry is replaced by the block's full key)."""
    if s.op != "cache_blocks":
        return None
    b, a = s.before, s.after
    if a.pool.ref_cnt != b.pool.ref_cnt or a.pool.free_queue != b.pool.free_queue:
        return "cache_blocks changed ref counts or the free queue"
    for blk in range(1, b.pool.num_blocks):
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


@invariant("§9.11", "step")
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


@invariant("§9.14", "step")
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
        processed = min(
            req.num_computed_tokens
            + s.args.get("num_new_computed_tokens", 0)
            + s.args.get("num_external_computed_tokens", 0),
            s.before.config.max_model_len,
        )
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
            return f"group {gid} request {rid!r}: positions {live} are out of the window ({processed} processed) but still hold blocks {list(table)}"
    return None


@invariant("P7", "step")
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


@invariant("§9.19", "step")
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


# --- running them ------------------------------------------------------------------------------------


def check_invariants(
    state: KVCacheManagerState,
    requests: Mapping[RequestId, Request],
    *,
    evict_called: bool = False,
    event_log: Sequence[Event] | None = None,
    names: Sequence[str] | None = None,
) -> list[Violation]:
    """Run every state invariant (or the named ones); return each violation with its name."""
    ctx = StateContext(state, requests, evict_called, event_log)
    return _run(ctx, "state", names)


def check_step(ctx: StepContext, names: Sequence[str] | None = None) -> list[Violation]:
    """Run every step postcondition (or the named ones) on one operation."""
    return _run(ctx, "step", names)


def _run(ctx: Any, kind: str, names: Sequence[str] | None) -> list[Violation]:
    out = []
    for inv in INVARIANTS.values():
        if inv.kind != kind or (names is not None and inv.name not in names):
            continue
        message = inv.check(ctx)
        if message is not None:
            out.append(Violation(inv.name, inv.rule, message))
    return out


def _short(key: bytes | None) -> str:
    return "no key" if key is None else key.hex()[:16]
