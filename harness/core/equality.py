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

from dataclasses import dataclass
from typing import Any

from harness.core.observation import Observation


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
    """The fields in which two observations differ, each naming the blocks and requests involved."""
    out: list[ObsDiff] = []
    if len(ref.tables) != len(tgt.tables):
        return [ObsDiff("tables", f"{len(ref.tables)} groups expected, {len(tgt.tables)} observed")]
    for g, (rt, tt) in enumerate(zip(ref.tables, tgt.tables, strict=True)):
        for rid in sorted(set(rt) | set(tt)):
            if rt.get(rid) != tt.get(rid):
                blocks = tuple(sorted(set(rt.get(rid, ())) ^ set(tt.get(rid, ())) - {0}))
                out.append(
                    ObsDiff(
                        "tables",
                        f"group {g} table of {rid!r}: expected {_fmt(rt.get(rid))}, observed {_fmt(tt.get(rid))}",
                        blocks,
                        (rid,),
                    )
                )
    for g, (rc, tc) in enumerate(zip(ref.num_cached_block, tgt.num_cached_block, strict=False)):
        for rid in sorted(set(rc) | set(tc)):
            if rc.get(rid) != tc.get(rid):
                out.append(
                    ObsDiff(
                        "num_cached_block",
                        f"group {g} num_cached_block of {rid!r}: expected {rc.get(rid)}, observed {tc.get(rid)}",
                        (),
                        (rid,),
                    )
                )
    if ref.num_blocks != tgt.num_blocks:
        out.append(ObsDiff("ref_cnt", f"{ref.num_blocks} blocks expected, {tgt.num_blocks} observed"))
    else:
        # Whole-tuple equality first (in C); the per-block walk only names the blocks of a difference.
        same_refs = ref.ref_cnt[1:] == tgt.ref_cnt[1:]
        bad = () if same_refs else tuple(b for b in range(1, ref.num_blocks) if ref.ref_cnt[b] != tgt.ref_cnt[b])
        if bad:
            detail = ", ".join(f"{b}: {ref.ref_cnt[b]} vs {tgt.ref_cnt[b]}" for b in bad[:6])
            out.append(ObsDiff("ref_cnt", f"ref counts differ (expected vs observed) {detail}", bad))
        same_keys = ref.block_key == tgt.block_key
        badk = () if same_keys else tuple(b for b in range(ref.num_blocks) if ref.block_key[b] != tgt.block_key[b])
        if badk:
            detail = ", ".join(f"{b}: {_hk(ref.block_key[b])} vs {_hk(tgt.block_key[b])}" for b in badk[:6])
            out.append(ObsDiff("block_key", f"block hashes differ (expected vs observed) {detail}", badk))
        if ref.block_key_tokens and tgt.block_key_tokens and ref.block_key_tokens != tgt.block_key_tokens:
            badt = tuple(b for b in range(ref.num_blocks) if ref.block_key_tokens[b] != tgt.block_key_tokens[b])
            detail = ", ".join(f"{b}: {ref.block_key_tokens[b]} vs {tgt.block_key_tokens[b]}" for b in badt[:6])
            out.append(
                ObsDiff(
                    "block_key_tokens", f"tokens covered by block keys differ (expected vs observed) {detail}", badt
                )
            )
    if ref.secondary_keys != tgt.secondary_keys:
        bads = tuple(
            sorted(
                b
                for b in set(ref.secondary_keys) | set(tgt.secondary_keys)
                if ref.secondary_keys.get(b) != tgt.secondary_keys.get(b)
            )
        )
        out.append(ObsDiff("secondary_keys", f"secondary (partial-entry) keys differ on block(s) {list(bads)}", bads))
    if ref.free_queue != tgt.free_queue:
        i = next(
            (i for i, (a, b) in enumerate(zip(ref.free_queue, tgt.free_queue, strict=False)) if a != b),
            min(len(ref.free_queue), len(tgt.free_queue)),
        )
        blocks = tuple(sorted(set(ref.free_queue[i : i + 3]) | set(tgt.free_queue[i : i + 3])))
        out.append(
            ObsDiff(
                "free_queue",
                f"free queue differs from position {i}: expected {list(ref.free_queue)}, "
                f"observed {list(tgt.free_queue)}",
                blocks,
            )
        )
    if ref.cached != tgt.cached:
        keys = sorted(set(ref.cached) | set(tgt.cached))
        for k in keys:
            if ref.cached.get(k) != tgt.cached.get(k):
                ids = tuple(sorted(set(ref.cached.get(k, ())) | set(tgt.cached.get(k, ()))))
                out.append(
                    ObsDiff(
                        "cached",
                        f"cached key {_hk(k)}: expected blocks {_fmt(ref.cached.get(k))}, "
                        f"observed {_fmt(tgt.cached.get(k))}",
                        ids,
                    )
                )
                break
        else:
            out.append(ObsDiff("cached", "hash map insertion order differs"))
    for rid in sorted(set(ref.request_block_hashes) | set(tgt.request_block_hashes)):
        a, b = ref.request_block_hashes.get(rid), tgt.request_block_hashes.get(rid)
        if a != b:
            n = next(
                (i for i, (x, y) in enumerate(zip(a or (), b or (), strict=False)) if x != y),
                min(len(a or ()), len(b or ())),
            )
            out.append(
                ObsDiff(
                    "request_block_hashes",
                    f"block hashes of {rid!r} differ from hash #{n} ({len(a or ())} expected, {len(b or ())} observed)",
                    (),
                    (rid,),
                )
            )
    return out[:limit]


def _fmt(t: Any) -> str:
    return "absent" if t is None else str(list(t))


def _hk(k: bytes | None) -> str:
    if k is None:
        return "-"
    return f"{k[:-4].hex()[:8]}/g{int.from_bytes(k[-4:], 'big')}"
