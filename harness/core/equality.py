"""Named equality relations between the reference spec and a target.

- ``exact`` (default): every outcome equal (block ids, hit lengths, None vs success, reset result,
  events in order) and, after every operation, the whole observation equal (tables, ref counts,
  free-queue order, hash map with its insertion order, ``num_cached_block``, request hashes).
- ``outcomes``: outcomes equal, observations not compared (the target's observation must still
  satisfy the invariants).  For managers that report their state differently but decide alike.
- ``invariants``: nothing is compared with the spec (it is not even run); only the invariants are
  checked on the target's observation.  For managers with a different eviction policy, whose block
  ids legitimately differ from vLLM's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvspec.harness.core.observation import Observation


@dataclass(frozen=True)
class Relation:
    name: str
    doc: str
    uses_reference: bool
    compare_outcomes: bool
    compare_observations: bool


RELATIONS: dict[str, Relation] = {
    "exact": Relation("exact", "outcomes and full observations equal", True, True, True),
    "outcomes": Relation("outcomes", "outcomes equal; observations only checked by invariants", True, True, False),
    "invariants": Relation(
        "invariants", "no reference; invariants on the target's observation only", False, False, False
    ),
}


def get_relation(name: str) -> Relation:
    try:
        return RELATIONS[name]
    except KeyError:
        raise ValueError(f"unknown equality relation {name!r} (known: {', '.join(RELATIONS)})") from None


def outcome_difference(expected: Any, actual: Any) -> str | None:
    """None if equal; else one sentence saying how (None vs success first, then the first field)."""
    if expected == actual:
        return None
    if expected is None or actual is None:
        return (
            f"expected {'None (out of blocks)' if expected is None else 'success'}, "
            f"got {'None (out of blocks)' if actual is None else 'success'}"
        )
    if isinstance(expected, dict) and isinstance(actual, dict):
        for k in sorted(set(expected) | set(actual)):
            if expected.get(k) != actual.get(k):
                return f"{k}: expected {expected.get(k)!r}, got {actual.get(k)!r}"
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return f"expected {len(expected)} item(s), got {len(actual)}"
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            if e != a:
                return f"item {i}: expected {e!r}, got {a!r}"
    return f"expected {expected!r}, got {actual!r}"


@dataclass(frozen=True)
class ObsDiff:
    field: str
    message: str
    blocks: tuple[int, ...] = ()
    requests: tuple[str, ...] = ()


def observation_differences(ref: Observation, tgt: Observation, limit: int = 8) -> list[ObsDiff]:
    """The fields in which two observations differ, each naming the blocks and requests involved:
    one comparison per observable, in ``OBSERVABLES`` order (none after a different group count)."""
    if ref == tgt:  # every field equal (in C): no observable can differ
        return []
    if len(ref.tables) != len(tgt.tables):
        return [ObsDiff("tables", f"{len(ref.tables)} groups expected, {len(tgt.tables)} observed")]
    return [d for compare in OBSERVABLES for d in compare(ref, tgt)][:limit]


def _tables(ref: Observation, tgt: Observation) -> list[ObsDiff]:
    """Each request's block table in each group; the blocks named are those in one table only."""
    out = []
    for g, (rt, tt) in enumerate(zip(ref.tables, tgt.tables, strict=True)):
        if rt == tt:  # whole-dict equality first (in C): no request below would differ
            continue
        for rid in sorted(set(rt) | set(tt)):
            if rt.get(rid) != tt.get(rid):
                blocks = tuple(sorted(set(rt.get(rid, ())) ^ set(tt.get(rid, ())) - {0}))
                message = f"group {g} table of {rid!r}: expected {_fmt(rt.get(rid))}, observed {_fmt(tt.get(rid))}"
                out.append(ObsDiff("tables", message, blocks, (rid,)))
    return out


def _num_cached_block(ref: Observation, tgt: Observation) -> list[ObsDiff]:
    """Each request's ``num_cached_block`` in each group."""
    out = []
    for g, (rc, tc) in enumerate(zip(ref.num_cached_block, tgt.num_cached_block, strict=False)):
        if rc == tc:
            continue
        for rid in sorted(set(rc) | set(tc)):
            if rc.get(rid) != tc.get(rid):
                message = f"group {g} num_cached_block of {rid!r}: expected {rc.get(rid)}, observed {tc.get(rid)}"
                out.append(ObsDiff("num_cached_block", message, (), (rid,)))
    return out


def _blocks(ref: Observation, tgt: Observation) -> list[ObsDiff]:
    """The pool's size, then (pools of one size only) each block's ref count, key and the tokens
    its key covers."""
    if ref.num_blocks != tgt.num_blocks:
        return [ObsDiff("ref_cnt", f"{ref.num_blocks} blocks expected, {tgt.num_blocks} observed")]
    return [*_ref_cnt(ref, tgt), *_block_key(ref, tgt), *_block_key_tokens(ref, tgt)]


def _ref_cnt(ref: Observation, tgt: Observation) -> list[ObsDiff]:
    """Each block's ref count (the null block's excepted)."""
    # Whole-tuple equality first (in C); the per-block walk only names the blocks of a difference.
    same = ref.ref_cnt[1:] == tgt.ref_cnt[1:]
    bad = () if same else tuple(b for b in range(1, ref.num_blocks) if ref.ref_cnt[b] != tgt.ref_cnt[b])
    if not bad:
        return []
    detail = ", ".join(f"{b}: {ref.ref_cnt[b]} vs {tgt.ref_cnt[b]}" for b in bad[:6])
    return [ObsDiff("ref_cnt", f"ref counts differ (expected vs observed) {detail}", bad)]


def _block_key(ref: Observation, tgt: Observation) -> list[ObsDiff]:
    """Each block's key (its block hash and group)."""
    same = ref.block_key == tgt.block_key
    bad = () if same else tuple(b for b in range(ref.num_blocks) if ref.block_key[b] != tgt.block_key[b])
    if not bad:
        return []
    detail = ", ".join(f"{b}: {_hk(ref.block_key[b])} vs {_hk(tgt.block_key[b])}" for b in bad[:6])
    return [ObsDiff("block_key", f"block hashes differ (expected vs observed) {detail}", bad)]


def _block_key_tokens(ref: Observation, tgt: Observation) -> list[ObsDiff]:
    """The tokens each block's key covers, when both observations report them."""
    if not (ref.block_key_tokens and tgt.block_key_tokens) or ref.block_key_tokens == tgt.block_key_tokens:
        return []
    bad = tuple(b for b in range(ref.num_blocks) if ref.block_key_tokens[b] != tgt.block_key_tokens[b])
    detail = ", ".join(f"{b}: {ref.block_key_tokens[b]} vs {tgt.block_key_tokens[b]}" for b in bad[:6])
    message = f"tokens covered by block keys differ (expected vs observed) {detail}"
    return [ObsDiff("block_key_tokens", message, bad)]


def _secondary_keys(ref: Observation, tgt: Observation) -> list[ObsDiff]:
    """The secondary (partial-entry) keys of blocks."""
    if ref.secondary_keys == tgt.secondary_keys:
        return []
    keyed = set(ref.secondary_keys) | set(tgt.secondary_keys)
    bad = tuple(sorted(b for b in keyed if ref.secondary_keys.get(b) != tgt.secondary_keys.get(b)))
    return [ObsDiff("secondary_keys", f"secondary (partial-entry) keys differ on block(s) {list(bad)}", bad)]


def _free_queue(ref: Observation, tgt: Observation) -> list[ObsDiff]:
    """The free queue, in order; the blocks named are those at and just after the first difference."""
    if ref.free_queue == tgt.free_queue:
        return []
    i = next(
        (i for i, (a, b) in enumerate(zip(ref.free_queue, tgt.free_queue, strict=False)) if a != b),
        min(len(ref.free_queue), len(tgt.free_queue)),
    )
    blocks = tuple(sorted(set(ref.free_queue[i : i + 3]) | set(tgt.free_queue[i : i + 3])))
    message = f"free queue differs from position {i}: expected {list(ref.free_queue)}, observed {list(tgt.free_queue)}"
    return [ObsDiff("free_queue", message, blocks)]


def _cached(ref: Observation, tgt: Observation) -> list[ObsDiff]:
    """The hash map: the first key whose blocks differ, else its insertion order."""
    if ref.cached == tgt.cached:
        return []
    for k in sorted(set(ref.cached) | set(tgt.cached)):
        if ref.cached.get(k) != tgt.cached.get(k):
            ids = tuple(sorted(set(ref.cached.get(k, ())) | set(tgt.cached.get(k, ()))))
            message = (
                f"cached key {_hk(k)}: expected blocks {_fmt(ref.cached.get(k))}, observed {_fmt(tgt.cached.get(k))}"
            )
            return [ObsDiff("cached", message, ids)]
    return [ObsDiff("cached", "hash map insertion order differs")]


def _request_block_hashes(ref: Observation, tgt: Observation) -> list[ObsDiff]:
    """Each request's block hashes, from the first that differs."""
    if ref.request_block_hashes == tgt.request_block_hashes:
        return []
    out = []
    for rid in sorted(set(ref.request_block_hashes) | set(tgt.request_block_hashes)):
        a, b = ref.request_block_hashes.get(rid), tgt.request_block_hashes.get(rid)
        if a != b:
            n = next(
                (i for i, (x, y) in enumerate(zip(a or (), b or (), strict=False)) if x != y),
                min(len(a or ()), len(b or ())),
            )
            counts = f"{len(a or ())} expected, {len(b or ())} observed"
            message = f"block hashes of {rid!r} differ from hash #{n} ({counts})"
            out.append(ObsDiff("request_block_hashes", message, (), (rid,)))
    return out


# The observables compared, in the order their differences are reported.
OBSERVABLES: tuple[Callable[[Observation, Observation], list[ObsDiff]], ...] = (
    _tables,
    _num_cached_block,
    _blocks,
    _secondary_keys,
    _free_queue,
    _cached,
    _request_block_hashes,
)


def _fmt(t: Any) -> str:
    return "absent" if t is None else str(list(t))


def _hk(k: bytes | None) -> str:
    if k is None:
        return "-"
    return f"{k[:-4].hex()[:8]}/g{int.from_bytes(k[-4:], 'big')}"
