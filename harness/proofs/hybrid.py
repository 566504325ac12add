"""Claims about the prefix-cache hit searches: per group, and the hybrid fixed point.

These run the spec's real search functions (``spec.managers.find_longest_cache_hit_*`` and
``spec.coordinator.find_longest_cache_hit_hybrid``) exhaustively, and compare each answer with the
longest length the groups *accept*, defined from the attention semantics alone: a group accepts a
hit of ``L`` tokens (``L`` a multiple of the hit alignment, ``L <= max_length``) when every block
holding a position the query at ``L`` attends to, before ``L``, is cached:

* full attention attends to ``[0, L)``;
* a sliding window ``W`` to ``[max(0, L - W + 1), L)``;
* chunked local attention (chunk ``C``) to ``[floor(L / C) * C, L)``.

Three claims, each exhaustive up to its stated bound:

* ``hit_search.per_group``: every per-kind search returns the longest accepted length at most
  ``max_length``, its lists have ``L / bs`` entries, every non-null entry is the block cached at
  that index, and every attended index is non-null.  Every pattern of up to 12 blocks; the lookup
  refuses indices at or beyond ``max_length // bs``, so the answer holds for every extension of
  the pattern.  Full: bs 1, 2 with alignment 1-3 blocks; sliding window: bs 1, 2, W 1, 2, 4, 5,
  alignment 1-2 blocks; chunked local: bs 1, 2, C 1-3 blocks (alignment = bs, as vLLM asserts).
  For W = 1 only soundness is claimed (the hit is accepted): vLLM 0.33's scan needs
  ``cdiv(W - 1, bs) = 0`` blocks but only tests the run length after a cached block, so with
  nothing cached it returns 0 although every length is accepted (harmless: it recomputes).
* ``hit_search.hybrid_fixed_point``: given per-group searches that return "the longest accepted
  length <= the candidate" (what ``per_group`` proves), the real fixed-point loop returns the
  longest length every group accepts; acceptance sets are arbitrary subsets of the aligned
  lengths (downward closed for full attention).  Bounds: FA + other over 12 aligned lengths; two
  non-FA groups over 8; FA + two others over 7; three non-FA over 5.
* ``hit_search.hybrid_end_to_end``: the loop with the real per-kind searches on real block
  patterns: FA + SW with equal block sizes (12 blocks each, every pattern), FA bs 2 + SW bs 1
  (LCM 2; 6 and 12 blocks), FA + SW + SW (6 blocks each), FA + chunked (12 blocks).  Full-attention
  patterns are enumerated as "cached prefix, then a miss" (13 classes), which ``per_group`` shows
  is all a full-attention search reads.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from kvspec.harness.proofs.core import COUNTEREXAMPLE, PROVEN, Claim, Outcome
from kvspec.spec import coordinator, managers
from kvspec.spec.config import AttentionSpec, chunked_local, full_attention, sliding_window
from kvspec.spec.types import NULL_BLOCK_ID, BlockId, GroupId

MAX_BLOCKS = 12


class LookupOutOfRange(AssertionError):
    pass


def attended_start(spec: AttentionSpec, L: int) -> int:
    """First position the query at ``L`` attends to (semantics, not the spec's formulas)."""
    if spec.kind == "sliding_window":
        assert spec.sliding_window is not None
        return max(0, L - spec.sliding_window + 1)
    if spec.kind == "chunked_local":
        assert spec.attention_chunk_size is not None
        return (L // spec.attention_chunk_size) * spec.attention_chunk_size
    return 0


def accepts(spec: AttentionSpec, pattern: Sequence[bool], L: int) -> bool:
    bs = spec.block_size
    first, end = attended_start(spec, L) // bs, -(-L // bs)
    return all(i < len(pattern) and pattern[i] for i in range(first, end))


def longest_accepted(spec: AttentionSpec, pattern: Sequence[bool], max_length: int, alignment: int) -> int:
    """``max(L for aligned L <= max_length if accepts(spec, pattern, L))``, via prefix counts of misses."""
    bs = spec.block_size
    misses = [0]
    for p in pattern:
        misses.append(misses[-1] + (not p))
    for L in range(max_length - max_length % alignment, -1, -alignment):
        first, end = attended_start(spec, L) // bs, -(-L // bs)
        if end <= len(pattern) and misses[end] == misses[min(first, end)]:
            return L
    raise AssertionError("0 is always accepted")


def block_id(group: int, i: int) -> BlockId:
    return BlockId(1000 * (group + 1) + i)


def lookup(pattern: Sequence[bool], group: int, limit: int) -> Callable[[int], Sequence[BlockId] | None]:
    def cached_at(i: int) -> Sequence[BlockId] | None:
        if i >= limit or i < 0:
            raise LookupOutOfRange(f"looked up block {i}, beyond max_length // bs = {limit}")
        return (block_id(group, i),) if i < len(pattern) and pattern[i] else None

    return cached_at


def search_group(spec: AttentionSpec, cached_at: Any, max_length: int, alignment: int) -> tuple[Any, int]:
    bs = spec.block_size
    if spec.kind == "full":
        return managers.find_longest_cache_hit_full(cached_at, 1, max_length, bs, alignment)
    if spec.kind == "sliding_window":
        assert spec.sliding_window is not None
        return managers.find_longest_cache_hit_sliding_window(
            cached_at, 1, max_length, bs, alignment, spec.sliding_window
        )
    assert spec.attention_chunk_size is not None
    return managers.find_longest_cache_hit_chunked_local(
        cached_at, 1, max_length, bs, alignment, spec.attention_chunk_size
    )


def check_lists(spec: AttentionSpec, pattern: Sequence[bool], lists: Any, L: int, group: int = 0) -> str:
    """'' when the returned block lists fit the hit, else what is wrong."""
    bs = spec.block_size
    for lst in lists:
        if len(lst) != L // bs:
            return f"list of {len(lst)} blocks for a hit of {L} tokens"
        for i, b in enumerate(lst):
            if b != NULL_BLOCK_ID and b != block_id(group, i):
                return f"entry {i} is block {b}, not the block cached there"
            if b != NULL_BLOCK_ID and not pattern[i]:
                return f"entry {i} is a block although nothing is cached there"
        for i in range(attended_start(spec, L) // bs, L // bs):
            if lst[i] == NULL_BLOCK_ID:
                return f"entry {i} is attended but null"
    return ""


def per_group_configs() -> list[tuple[AttentionSpec, int]]:
    out: list[tuple[AttentionSpec, int]] = []
    for bs in (1, 2):
        out += [(full_attention(bs), k * bs) for k in (1, 2, 3)]
        out += [(sliding_window(bs, w), k * bs) for w in (1, 2, 4, 5) for k in (1, 2)]
        out += [(chunked_local(bs, k * bs), bs) for k in (1, 2, 3)]
    return out


def _where(spec: AttentionSpec, alignment: int, max_length: int, pattern: Sequence[bool]) -> dict[str, Any]:
    return {
        "spec": repr(spec),
        "alignment": alignment,
        "max_length": max_length,
        "pattern": "".join("T" if p else "F" for p in pattern),
    }


def check_per_group(timeout_s: float) -> Outcome:
    for spec, alignment in per_group_configs():
        bs = spec.block_size
        for nb in range(MAX_BLOCKS + 1):
            for max_length in sorted({nb * bs, nb * bs + bs - 1}):
                for pattern in itertools.product((False, True), repeat=nb):
                    try:
                        lists, L = search_group(spec, lookup(pattern, 0, nb), max_length, alignment)
                    except LookupOutOfRange as e:
                        where = _where(spec, alignment, max_length, pattern)
                        return Outcome(COUNTEREXAMPLE, "looks only below max_length", where, str(e))
                    want = longest_accepted(spec, pattern, max_length, alignment)
                    if spec.kind == "sliding_window" and spec.sliding_window == 1:
                        want = L if accepts(spec, pattern, L) and L <= max_length and L % alignment == 0 else want
                    if L != want:
                        return Outcome(
                            COUNTEREXAMPLE,
                            "returns the longest accepted length",
                            {**_where(spec, alignment, max_length, pattern), "hit": L, "longest_accepted": want},
                        )
                    wrong = check_lists(spec, pattern, lists, L)
                    if wrong:
                        where = _where(spec, alignment, max_length, pattern)
                        return Outcome(COUNTEREXAMPLE, "lists fit the hit", {**where, "hit": L}, wrong)
    return Outcome(PROVEN)


# --- the fixed point over abstract acceptance sets ---------------------------------------------


def _abstract_search(accepted: dict[GroupId, frozenset[int]]) -> coordinator.SearchFn:
    def search(sg: coordinator.SpecGroup, max_length: int) -> tuple[Any, int]:
        ok = accepted[sg.group_ids[0]]
        return tuple(() for _ in sg.group_ids), max(L for L in ok if L <= max_length)

    return search


def _sets(kind: str, K: int) -> list[frozenset[int]]:
    if kind == "full":
        return [frozenset(range(m + 1)) for m in range(K + 1)]
    return [frozenset({0} | {L for L in range(1, K + 1) if bits >> (L - 1) & 1}) for bits in range(1 << K)]


def check_fixed_point(timeout_s: float) -> Outcome:
    shapes = [
        (("full", "sliding_window"), 12),
        (("sliding_window", "sliding_window"), 8),
        (("full", "sliding_window", "sliding_window"), 7),
        (("sliding_window", "sliding_window", "sliding_window"), 5),
    ]
    for kinds, K in shapes:
        groups = tuple(
            coordinator.SpecGroup(full_attention(1) if k == "full" else sliding_window(1, 2 + g), (GroupId(g),))
            for g, k in enumerate(kinds)
        )
        for sets in itertools.product(*[_sets(k, K) for k in kinds]):
            accepted = {GroupId(g): s for g, s in enumerate(sets)}
            _, L, _ = coordinator.find_longest_cache_hit_hybrid(groups, len(groups), K, _abstract_search(accepted))
            want = max(frozenset.intersection(*sets))
            if L != want:
                return Outcome(
                    COUNTEREXAMPLE,
                    "the fixed point is the longest length all groups accept",
                    {"kinds": list(kinds), "accepted": [sorted(s) for s in sets], "hit": L, "longest_common": want},
                )
    return Outcome(PROVEN)


# --- end to end on block patterns --------------------------------------------------------------


def _patterns(spec: AttentionSpec, nb: int) -> list[tuple[bool, ...]]:
    if spec.kind == "full":
        return [tuple(i < m for i in range(nb)) for m in range(nb + 1)]
    return list(itertools.product((False, True), repeat=nb))


def end_to_end_configs() -> list[tuple[tuple[AttentionSpec, ...], tuple[int, ...]]]:
    return [
        ((full_attention(2), sliding_window(2, 5)), (12, 12)),
        ((full_attention(2), sliding_window(1, 3)), (6, 12)),
        ((sliding_window(2, 3), full_attention(1)), (6, 12)),
        ((full_attention(1), sliding_window(1, 2), sliding_window(1, 4)), (6, 6, 6)),
        ((full_attention(1), chunked_local(1, 3)), (12, 12)),
    ]


def check_end_to_end(timeout_s: float) -> Outcome:
    for specs, nbs in end_to_end_configs():
        alignment = 1
        for s in specs:
            alignment = alignment * s.block_size // _gcd(alignment, s.block_size)
        cap = min(nb * s.block_size for nb, s in zip(nbs, specs))
        spec_groups = tuple(
            sorted(
                (coordinator.SpecGroup(s, (GroupId(g),)) for g, s in enumerate(specs)),
                key=lambda sg: sg.spec.kind != "full",
            )
        )
        for patterns in itertools.product(*[_patterns(s, nb) for s, nb in zip(specs, nbs)]):

            def search(
                sg: coordinator.SpecGroup,
                max_length: int,
                specs: Any = specs,
                patterns: Any = patterns,
                alignment: int = alignment,
            ) -> tuple[Any, int]:
                g = sg.group_ids[0]
                s = specs[g]
                return search_group(s, lookup(patterns[g], g, max_length // s.block_size), max_length, alignment)

            where = {
                "specs": [repr(s) for s in specs],
                "cap": cap,
                "patterns": ["".join("T" if p else "F" for p in pat) for pat in patterns],
            }
            try:
                lists, L, _ = coordinator.find_longest_cache_hit_hybrid(spec_groups, len(specs), cap, search)
            except LookupOutOfRange as e:
                return Outcome(COUNTEREXAMPLE, "looks only below the candidate length", where, str(e))
            want = max(
                L2 for L2 in range(0, cap + 1, alignment) if all(accepts(s, pat, L2) for s, pat in zip(specs, patterns))
            )
            if L != want:
                return Outcome(
                    COUNTEREXAMPLE,
                    "the hybrid hit is the longest aligned length all groups accept",
                    {**where, "hit": L, "longest_common": want},
                )
            for g, (s, pat) in enumerate(zip(specs, patterns)):
                wrong = check_lists(s, pat, (lists[g],), L, g)
                if wrong:
                    return Outcome(
                        COUNTEREXAMPLE, "every group's lists fit the common hit", {**where, "group": g, "hit": L}, wrong
                    )
    return Outcome(PROVEN)


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


CLAIMS = [
    Claim(
        "hit_search.per_group",
        "Each per-kind hit search returns the longest aligned length <= max_length that its group "
        "accepts (full: maximal prefix), with lists that hold exactly the cached blocks it needs.",
        (
            "attention semantics: full [0, L), sliding window [L-W+1, L), chunked [floor(L/C)*C, L)",
            "chunked local: alignment == block_size and C a multiple of it (vLLM asserts the first)",
        ),
        check_per_group,
        bound="every pattern of <= 12 blocks; bs 1-2; W 1, 2, 4, 5; C 1-3 blocks; alignment 1-3 blocks",
    ),
    Claim(
        "hit_search.hybrid_fixed_point",
        "The hybrid fixed-point loop returns the longest length every group accepts, given per-group "
        "searches that return the longest accepted length <= the candidate.",
        ("full-attention acceptance is downward closed", "0 is always accepted"),
        check_fixed_point,
        bound="acceptance sets over 12 (FA+1), 8 (2 others), 7 (FA+2), 5 (3 others) aligned lengths",
    ),
    Claim(
        "hit_search.hybrid_end_to_end",
        "With the real per-kind searches, the hybrid hit is the longest LCM-aligned length that every "
        "group accepts, and every group's hit lists fit it.",
        ("attention semantics as in hit_search.per_group",),
        check_end_to_end,
        bound="FA+SW equal bs 12 blocks; FA bs2 + SW bs1 (6/12 blocks); FA+SW+SW 6 blocks; FA+chunked 12 blocks",
    ),
]
