"""SGLang's policy: state predicates over the facts an SGLang radix cache reports (docs/semantics.md §12).

SGLang (0.5.23 ``UnifiedRadixCache``) keeps evictable pages in its radix tree, out of the free pool,
and protects a tree node by its ``lock_ref`` while a request reads it.  Its own checks are a tree
``sanity_check``, the scheduler's idle check (free plus evictable equals the pool) and page-aligned
request rows.  kvspec states them here, tagged ``SGLANG_POLICY``, so they run on the ``sglang``
target only, reading ``StateContext.facts`` (``Observation.facts``) in this form:

- ``sizes``: ``{"available", "evictable", "protected", "total"}``, what SGLang reports, in tokens
  (per pool: ``full``, and ``swa`` with a sliding window);
- ``tree``: one ``[node, parent, tokens, lock_ref, pool]`` per tree node but the root, read by walking
  the tree (``tokens``: the KV slots the node holds in that pool);
- ``sanity``: None, or what SGLang's ``sanity_check`` raised;
- ``live``: how many requests hold a request row;
- ``reads``: ``[request, page, node, pool]`` for every tree page a live request reads: each full
  page of its row, and the sliding-window pages in the window of its next query;
- ``rows``: request -> its full-pool KV slot per position, and ``page_size``.

Imports: spec.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from kvspec.spec.invariants.registry import SGLANG_POLICY, SPEC_INVARIANTS, StateContext


def _tree_sizes(tree: list[list[Any]], pool: str) -> tuple[int, int]:
    """(evictable, protected) tokens of ``pool`` by the tree walk: unlocked nodes are evictable."""
    evictable = protected = 0
    for _, _, tokens, lock_ref, where in tree:
        if where != pool:
            continue
        if lock_ref > 0:
            protected += tokens
        else:
            evictable += tokens
    return evictable, protected


@SPEC_INVARIANTS.register("§12.1", "state", SGLANG_POLICY)
def sglang_sanity_check(c: StateContext) -> str | None:
    """SGLang's own tree check passes (0.5.23 ``UnifiedRadixCache.sanity_check``: the tree's lock
    and size bookkeeping agree with its nodes)."""
    problem = c.facts.get("sanity")
    return None if problem is None else f"SGLang's sanity_check failed: {problem}"


@SPEC_INVARIANTS.register("§12.2", "state", SGLANG_POLICY)
def sglang_sizes_match_tree(c: StateContext) -> str | None:
    """The evictable and protected sizes SGLang reports are the unlocked and locked tokens of its
    tree, each node counted once (the scheduler sizes admission and eviction on them)."""
    tree = c.facts.get("tree", [])
    for pool, sizes in c.facts.get("sizes", {}).items():
        evictable, protected = _tree_sizes(tree, pool)
        if (sizes["evictable"], sizes["protected"]) != (evictable, protected):
            return (
                f"{pool} pool: SGLang reports {sizes['evictable']} evictable and {sizes['protected']} protected "
                f"tokens, its tree holds {evictable} unlocked and {protected} locked"
            )
    return None


@SPEC_INVARIANTS.register("§12.3", "state", SGLANG_POLICY)
def sglang_idle_conservation(c: StateContext) -> str | None:
    """With no request live, available plus evictable is the whole pool and nothing is protected
    (the scheduler's idle memory check, on by default in 0.5.23)."""
    if c.facts.get("live", 1):
        return None
    for pool, s in c.facts.get("sizes", {}).items():
        if s["available"] + s["evictable"] != s["total"] or s["protected"]:
            return (
                f"{pool} pool at idle: {s['available']} available + {s['evictable']} evictable != "
                f"{s['total']} total, or {s['protected']} still protected"
            )
    return None


@SPEC_INVARIANTS.register("§12.4", "state", SGLANG_POLICY)
def sglang_read_pages_locked(c: StateContext) -> str | None:
    """Every tree page a live request reads lies in a node locked in that page's pool (``lock_ref >
    0``): a page being read cannot be evicted (a sliding window's pages: those in the window)."""
    locks = {(node, pool): lock_ref for node, _, _, lock_ref, pool in c.facts.get("tree", [])}
    for request, page, node, pool in c.facts.get("reads", []):
        if locks.get((node, pool), 0) <= 0:
            return f"request {request!r} reads page {page} of tree node {node}, not locked in the {pool} pool"
    return None


@SPEC_INVARIANTS.register("§12.5", "state", SGLANG_POLICY)
def sglang_rows_page_aligned(c: StateContext) -> str | None:
    """A request row's slots come in whole pages: position ``p`` sits at offset ``p % page_size`` of
    a page, and the positions of one page share it (the paged allocator's contract)."""
    size = c.facts.get("page_size", 1)
    for request, row in c.facts.get("rows", {}).items():
        pages: dict[int, set[int]] = defaultdict(set)
        for p, slot in enumerate(row):
            if slot % size != p % size:
                return f"request {request!r} position {p} is at slot {slot}, offset {slot % size} in its page"
            pages[p // size].add(slot // size)
        split = next((i for i, ps in pages.items() if len(ps) > 1), None)
        if split is not None:
            return f"request {request!r} page {split} of its row spans pages {sorted(pages[split])}"
    return None
