"""Invariants checked on an ``Observation``: what the harness can say about any target's state.

``spec.invariants`` checks the spec's own state; these checks need only what every target reports
(tables, ref counts, free-queue order, hash map, request hashes), so they run on the observed state
of vLLM, ``impl`` or a user's manager as well.  Each check cites the rule of
/work/shared/reference/vllm-kv-semantics.md section 9 it encodes (numbers in brackets) and
returns ``Violation``s that name the blocks and requests involved.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from harness.observation import Observation
from spec.config import KVCacheConfig, Profile

NULL = 0


@dataclass(frozen=True)
class ObsViolation:
    name: str
    message: str
    blocks: tuple[int, ...] = ()
    requests: tuple[str, ...] = ()


@dataclass
class ObsContext:
    """What the harness knows beyond the observation: request sizes and the history so far."""

    num_tokens: Mapping[str, int] = field(default_factory=dict)  # request id -> num_tokens
    evicted_ever: bool = False  # evict_blocks was called (relaxes [8], [10], [16])


Check = Callable[[Observation, KVCacheConfig, ObsContext], list[ObsViolation]]
CHECKS: dict[str, Check] = {}


def _check(name: str) -> Callable[[Check], Check]:
    def deco(fn: Check) -> Check:
        CHECKS[name] = fn
        return fn

    return deco


def _key_group(key: bytes) -> int:
    return int.from_bytes(key[-4:], "big")


@_check("null_block")
def null_block(obs: Observation, config: KVCacheConfig, ctx: ObsContext) -> list[ObsViolation]:
    """[1] Block 0 is the null block: never free-queued, never hashed, never a map value."""
    out = []
    if NULL in obs.free_queue:
        out.append(ObsViolation("null_block", "the null block 0 is in the free queue", (NULL,)))
    if obs.block_key and obs.block_key[NULL] is not None:
        out.append(ObsViolation("null_block", "the null block 0 carries a block hash", (NULL,)))
    for key, ids in obs.cached.items():
        if NULL in ids:
            out.append(ObsViolation("null_block", f"the null block 0 is cached under key {key.hex()[:12]}", (NULL,)))
    return out


@_check("free_queue_well_formed")
def free_queue_well_formed(obs: Observation, config: KVCacheConfig, ctx: ObsContext) -> list[ObsViolation]:
    """[2] The free queue lists distinct real block ids."""
    counts = Counter(obs.free_queue)
    dups = tuple(sorted(b for b, c in counts.items() if c > 1))
    bad = tuple(sorted(b for b in counts if not 0 <= b < obs.num_blocks))
    out = []
    if dups:
        out.append(ObsViolation("free_queue_well_formed", f"block(s) {list(dups)} appear twice in the free queue", dups))
    if bad:
        out.append(ObsViolation("free_queue_well_formed", f"free queue holds unknown block id(s) {list(bad)}", bad))
    if obs.num_blocks != config.num_blocks:
        out.append(ObsViolation("free_queue_well_formed", f"{obs.num_blocks} blocks observed, config has {config.num_blocks}"))
    return out


@_check("free_iff_unreferenced")
def free_iff_unreferenced(obs: Observation, config: KVCacheConfig, ctx: ObsContext) -> list[ObsViolation]:
    """[3], [4] A real block is in the free queue iff its ref count is 0; counts are >= 0."""
    queued = set(obs.free_queue)
    out = []
    for b in range(1, obs.num_blocks):
        ref = obs.ref_cnt[b]
        if ref < 0:
            out.append(ObsViolation("free_iff_unreferenced", f"block {b} has ref_cnt {ref} < 0", (b,)))
        elif (ref == 0) != (b in queued):
            where = "in" if b in queued else "not in"
            out.append(ObsViolation("free_iff_unreferenced", f"block {b} has ref_cnt {ref} but is {where} the free queue", (b,)))
    return out


def _references(obs: Observation) -> dict[int, list[tuple[int, str, int]]]:
    refs: dict[int, list[tuple[int, str, int]]] = {}
    for g, tables in enumerate(obs.tables):
        for rid, table in tables.items():
            for i, b in enumerate(table):
                if b != NULL:
                    refs.setdefault(b, []).append((g, rid, i))
    return refs


@_check("ref_count")
def ref_count(obs: Observation, config: KVCacheConfig, ctx: ObsContext) -> list[ObsViolation]:
    """[5] A block's ref count is the number of table slots that hold it."""
    refs = _references(obs)
    out = []
    for b in range(1, obs.num_blocks):
        n = len(refs.get(b, ()))
        if obs.ref_cnt[b] != n:
            holders = tuple(sorted({rid for _, rid, _ in refs.get(b, ())}))
            out.append(ObsViolation("ref_count", f"block {b} has ref_cnt {obs.ref_cnt[b]} but {n} table slot(s) hold it", (b,), holders))
    unknown = tuple(sorted(b for b in refs if not 0 < b < obs.num_blocks))
    if unknown:
        out.append(ObsViolation("ref_count", f"tables hold unknown block id(s) {list(unknown)}", unknown))
    return out


@_check("one_group_per_block")
def one_group_per_block(obs: Observation, config: KVCacheConfig, ctx: ObsContext) -> list[ObsViolation]:
    """[6] All references to a block come from one group, the group its hash key names."""
    out = []
    for b, slots in _references(obs).items():
        groups = {g for g, _, _ in slots}
        if len(groups) > 1:
            out.append(ObsViolation("one_group_per_block", f"block {b} is held by groups {sorted(groups)}", (b,)))
        elif 0 < b < obs.num_blocks and obs.block_key[b] is not None and _key_group(obs.block_key[b]) not in groups:  # type: ignore[arg-type]
            key = obs.block_key[b]
            assert key is not None
            out.append(ObsViolation("one_group_per_block", f"block {b} is held by group {groups.pop()} but hashed for group {_key_group(key)}", (b,)))
    return out


@_check("table_shape")
def table_shape(obs: Observation, config: KVCacheConfig, ctx: ObsContext) -> list[ObsViolation]:
    """[7], [13], [14] No block twice in a table; no table longer than max_model_len allows;
    full-attention tables have no nulls, sliding-window and chunked-local ones a null prefix."""
    out = []
    for g, tables in enumerate(obs.tables):
        spec = config.groups[g] if g < len(config.groups) else None
        for rid, table in tables.items():
            real = [b for b in table if b != NULL]
            dups = tuple(sorted(b for b, c in Counter(real).items() if c > 1))
            if dups:
                out.append(ObsViolation("table_shape", f"group {g} table of {rid!r} holds block(s) {list(dups)} twice", dups, (rid,)))
            if spec is None:
                continue
            limit = -(-config.max_model_len // spec.block_size)
            if len(table) > limit:
                out.append(ObsViolation("table_shape", f"group {g} table of {rid!r} has {len(table)} blocks > cdiv(max_model_len, bs) = {limit}", (), (rid,)))
            if spec.kind == "full" and NULL in table:
                out.append(ObsViolation("table_shape", f"full-attention group {g} table of {rid!r} holds a null block: {list(table)}", (), (rid,)))
            if spec.kind in ("sliding_window", "chunked_local"):
                first_real = next((i for i, b in enumerate(table) if b != NULL), len(table))
                if any(b == NULL for b in table[first_real:]):
                    out.append(ObsViolation("table_shape", f"group {g} table of {rid!r} has a null after a real block: {list(table)}", (), (rid,)))
    return out


@_check("shared_blocks_same_index")
def shared_blocks_same_index(obs: Observation, config: KVCacheConfig, ctx: ObsContext) -> list[ObsViolation]:
    """[8] A block shared by two requests sits at the same index in both and is hashed."""
    out = []
    for b, slots in _references(obs).items():
        if len({rid for _, rid, _ in slots}) < 2:
            continue
        idx = {i for _, _, i in slots}
        rids = tuple(sorted({rid for _, rid, _ in slots}))
        if len(idx) > 1:
            out.append(ObsViolation("shared_blocks_same_index", f"block {b} is shared at different indices {sorted(idx)}", (b,), rids))
        elif not ctx.evicted_ever and 0 < b < obs.num_blocks and obs.block_key[b] is None:
            out.append(ObsViolation("shared_blocks_same_index", f"block {b} is shared by {list(rids)} but unhashed", (b,), rids))
    return out


@_check("hash_map_consistent")
def hash_map_consistent(obs: Observation, config: KVCacheConfig, ctx: ObsContext) -> list[ObsViolation]:
    """[9] Every block stored under a key carries that key, and every hashed block is stored."""
    out = []
    for key, ids in obs.cached.items():
        if not ids:
            out.append(ObsViolation("hash_map_consistent", f"key {key.hex()[:12]} maps to no block"))
        if len(set(ids)) != len(ids):
            out.append(ObsViolation("hash_map_consistent", f"key {key.hex()[:12]} lists a block twice: {list(ids)}", tuple(ids)))
        for b in ids:
            if not 0 < b < obs.num_blocks or (obs.block_key[b] != key and key not in obs.secondary_keys.get(b, ())):
                out.append(ObsViolation("hash_map_consistent", f"block {b} is cached under key {key.hex()[:12]} but carries another key", (b,)))
    for b in range(1, obs.num_blocks):
        key = obs.block_key[b]
        if key is not None and b not in obs.cached.get(key, ()):
            out.append(ObsViolation("hash_map_consistent", f"block {b} carries key {key.hex()[:12]} but is not in the map under it", (b,)))
    if not config.enable_caching and obs.cached:
        out.append(ObsViolation("hash_map_consistent", f"caching is off but {len(obs.cached)} key(s) are cached"))
    return out


def _view_hash(hashes: tuple[bytes, ...], hbs: int, bs: int, i: int) -> bytes | None:
    """vLLM 0.33 ``BlockHashListWithBlockSize``: block i of size bs is the last fine hash inside it."""
    j = (i + 1) * (bs // hbs) - 1
    return hashes[j] if j < len(hashes) else None


@_check("cached_blocks_correct")
def cached_blocks_correct(obs: Observation, config: KVCacheConfig, ctx: ObsContext) -> list[ObsViolation]:
    """[10], [11], [15] A hashed block in a table carries the request's hash for that position;
    blocks past ``num_cached_block`` are unhashed; cache bounds; ``num_cached_block`` keys have tables."""
    out = []
    hbs = config.hash_block_size
    for g, tables in enumerate(obs.tables):
        spec = config.groups[g] if g < len(config.groups) else None
        ncb = obs.num_cached_block[g] if g < len(obs.num_cached_block) else {}
        for rid in ncb:
            if rid not in tables:
                out.append(ObsViolation("cached_blocks_correct", f"group {g}: {rid!r} has num_cached_block but no table", (), (rid,)))
        if spec is None:
            continue
        bs = spec.block_size
        for rid, table in tables.items():
            c = ncb.get(rid, 0)
            hashes = obs.request_block_hashes.get(rid, ())
            if c > len(table):
                out.append(ObsViolation("cached_blocks_correct", f"group {g}: {rid!r} num_cached_block {c} > table length {len(table)}", (), (rid,)))
            if config.enable_caching and c * bs > len(hashes) * hbs:
                out.append(ObsViolation("cached_blocks_correct", f"group {g}: {rid!r} caches {c} blocks but has only {len(hashes)} hashes of {hbs}", (), (rid,)))
            n = ctx.num_tokens.get(rid)
            if n is not None and c * bs > n:
                out.append(ObsViolation("cached_blocks_correct", f"group {g}: {rid!r} caches {c * bs} tokens > num_tokens {n} (drafts cached?)", (), (rid,)))
            for i, b in enumerate(table):
                if b == NULL or not 0 < b < obs.num_blocks:
                    continue
                key = obs.block_key[b]
                if key is None:
                    continue
                if i >= c:
                    out.append(ObsViolation("cached_blocks_correct", f"group {g}: block {b} at index {i} of {rid!r} is hashed but num_cached_block is {c}", (b,), (rid,)))
                    continue
                want = _view_hash(hashes, hbs, bs, i)
                if want is None or key != want + g.to_bytes(4, "big"):
                    out.append(ObsViolation("cached_blocks_correct", f"group {g}: block {b} at index {i} of {rid!r} carries a hash that is not the request's hash for that block", (b,), (rid,)))
    return out


@_check("free_queue_partition")
def free_queue_partition(obs: Observation, config: KVCacheConfig, ctx: ObsContext) -> list[ObsViolation]:
    """[16] (0.33 order) Unhashed free blocks all come before hashed ones (LIFO front, LRU tail)."""
    if config.profile != Profile.V0_33 or ctx.evicted_ever:
        return []
    seen_hashed = None
    for b in obs.free_queue:
        if not 0 < b < obs.num_blocks:
            continue
        if obs.block_key[b] is not None:
            seen_hashed = b if seen_hashed is None else seen_hashed
        elif seen_hashed is not None:
            return [ObsViolation("free_queue_partition", f"unhashed free block {b} comes after hashed free block {seen_hashed}", (b, seen_hashed))]
    return []


def check_observation(obs: Observation, config: KVCacheConfig, ctx: ObsContext | None = None) -> list[ObsViolation]:
    """Run every observation invariant; an empty list means the observed state is consistent."""
    ctx = ctx or ObsContext()
    out: list[ObsViolation] = []
    for fn in CHECKS.values():
        out.extend(fn(obs, config, ctx))
    return out


class EventLedger:
    """[20] Replaying the events rebuilds the hash map: per key, stored minus removed equals the
    number of blocks the map holds under it (duplicates included); ``AllBlocksCleared`` empties it."""

    def __init__(self) -> None:
        self.count: Counter[bytes] = Counter()

    def feed(self, events: list[dict[str, object]]) -> None:
        for e in events:
            t = e.get("type")
            if t == "AllBlocksCleared":
                self.count.clear()
                continue
            gid = int(e["group_id"]).to_bytes(4, "big")  # type: ignore[call-overload]
            for h in e["block_hashes"]:  # type: ignore[union-attr]
                key = bytes.fromhex(str(h)) + gid
                self.count[key] += 1 if t == "BlockStored" else -1

    def check(self, obs: Observation) -> list[ObsViolation]:
        out = []
        keys = set(self.count) | set(obs.cached)
        for key in sorted(keys):
            want = len(obs.cached.get(key, ()))
            got = self.count.get(key, 0)
            if want != got:
                out.append(
                    ObsViolation(
                        "events_replay",
                        f"events say key {key[:-4].hex()[:12]}/g{_key_group(key)} is stored {got} time(s), the map holds {want} block(s)",
                        tuple(obs.cached.get(key, ())),
                    )
                )
        return out
