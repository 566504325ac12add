"""Deliberate bugs in SGLang's radix cache (0.5.23), each a runtime patch active only inside the
``sglang`` target's calls (``MutantSglangTarget``), its observation included: what SGLang reports
(its sizes, its sanity check) is part of what a bug can get wrong.

Each names the check written to catch it (``intended``): an engine-neutral invariant, one of
SGLang's own (``spec.invariants.state_sglang``) or the KV ledger (tests/sglang_target/test_sglang_mutants.py
runs each and asserts that check caught it).  The slips are the kinds of bug SGLang has shipped
(docs/sglang.md): a lock leaked, a split losing KV, a page read while evictable, a double free, a
size that double-counts, a match pointing at the wrong slots, a window slid one token too far.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from kvspec.harness.mutants.record import Mutant, MutatedTarget, Patch, by_name, doc_of
from kvspec.harness.sglang.target import SglangTarget

CACHE = "sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache"
CORE = "sglang.srt.mem_cache.unified_cache.unified_tree_core:UnifiedTreeCore"
PAGED = "sglang.srt.mem_cache.allocator.paged:PagedTokenToKVPoolAllocator"
BASE = "sglang.srt.mem_cache.base_prefix_cache:BasePrefixCache"


def _full_data(node: Any) -> Any:
    """A tree node's full-attention component (its KV slots ``value``, its ``lock_ref``)."""
    components = importlib.import_module("sglang.srt.mem_cache.unified_cache.components")
    return node.component_data[components.ComponentType.FULL]


def _lock_leak_on_miss(orig: Callable[..., Any]) -> Callable[..., Any]:
    """a match that misses part of its key leaves a lock on the node where it stopped"""

    def match_prefix(self: Any, params: Any) -> Any:
        result = orig(self, params)
        node = result.last_device_node
        if result.device_prefix_len < len(params.key) and node != self.root_node_handle():
            self.lock(node)  # never unlocked
        return result

    return match_prefix


def _split_drops_child_value(orig: Callable[..., Any]) -> Callable[..., Any]:
    """splitting a node drops the last page of the lower half's key and KV slots"""

    def _split_node(self: Any, key: Any, child: Any, split_len: int) -> Any:
        out = orig(self, key, child, split_len)
        data, page = _full_data(child), self.page_size
        if data.lock_ref == 0 and not child.children and data.value is not None and len(data.value) > page:
            child.key, data.value = child.key[:-page], data.value[:-page]
        return out

    return _split_node


def _lock_wrong_node(orig: Callable[..., Any]) -> Callable[..., Any]:
    """a request's lock lands on its node's parent, so the node it reads stays evictable"""

    def lock(self: Any, node: Any, *args: Any, **kwargs: Any) -> Any:
        core = self.tree_core
        real = core.node_by_id(node) if isinstance(node, int) else node
        parent = getattr(real, "parent", None)
        if parent is not None and parent is not core.root_node:
            node = parent.id if isinstance(node, int) else parent
        return orig(self, node, *args, **kwargs)

    return lock


def _double_free(orig: Callable[..., Any]) -> Callable[..., Any]:
    """the paged allocator releases the first page of a freed range twice"""

    def _release_page_ids(self: Any, page_ids: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig(self, page_ids, *args, **kwargs)
        if len(page_ids):
            orig(self, page_ids[:1], *args, **kwargs)
        return out

    return _release_page_ids


def _evictable_double_counts(orig: Callable[..., Any]) -> Callable[..., Any]:
    """the evictable size counts an unlocked node that prefixes two others twice"""

    def evictable_size(self: Any) -> int:
        size: int = orig(self)
        stack = list(self.tree_core.root_node.children.values())
        while stack:
            node = stack.pop()
            data = _full_data(node)
            if len(node.children) >= 2 and data.lock_ref == 0 and data.value is not None:
                size += len(data.value)
            stack.extend(node.children.values())
        return size

    return evictable_size


def _wrong_slot_match(orig: Callable[..., Any]) -> Callable[..., Any]:
    """a matched prefix hands out its last two pages in swapped order"""

    def prefix_device_indices(self: Any, req: Any) -> Any:
        out = orig(self, req)
        page = self.page_size
        if len(out) >= 2 * page:
            out = out.clone()
            last, before = out[-page:].clone(), out[-2 * page : -page].clone()
            out[-page:], out[-2 * page : -page] = before, last
        return out

    return prefix_device_indices


def _window_slides_one_too_far(orig: Callable[..., Any]) -> Callable[..., Any]:
    """a decoding request's window slides as if the token being computed were already in, freeing
    the sliding-window slot of the oldest position its query still reads"""

    def evict_sliding_windows(self: Any, req: Any, pre_len: int, **kwargs: Any) -> Any:
        return orig(self, req, pre_len + 1, **kwargs)

    return evict_sliding_windows


def _sglang_mutant(name: str, owner: str, attr: str, wrap: Any, intended: str, family: str = "full") -> Mutant:
    return Mutant(name, "sglang", doc_of(wrap), family, ("invariants",), intended, Patch(owner, attr, wrap))


MUTANTS: dict[str, Mutant] = by_name(
    (
        _sglang_mutant(
            "sglang_lock_leak_on_miss", CACHE, "match_prefix", _lock_leak_on_miss, "sglang_idle_conservation"
        ),
        _sglang_mutant("sglang_split_drops_value", CORE, "_split_node", _split_drops_child_value, "conservation"),
        _sglang_mutant("sglang_lock_wrong_node", CACHE, "lock", _lock_wrong_node, "sglang_read_pages_locked"),
        _sglang_mutant("sglang_paged_double_free", PAGED, "_release_page_ids", _double_free, "free_queue_well_formed"),
        _sglang_mutant(
            "sglang_evictable_double_counts",
            CACHE,
            "evictable_size",
            _evictable_double_counts,
            "sglang_sizes_match_tree",
        ),
        _sglang_mutant(
            "sglang_wrong_slot_match",
            CACHE,
            "prefix_device_indices",
            _wrong_slot_match,
            "hashed_means_full_and_correct",
        ),
        _sglang_mutant(
            "sglang_window_off_by_one",
            BASE,
            "evict_sliding_windows",
            _window_slides_one_too_far,
            "kv_read_in_real_block",
            "hybrid_equal",
        ),
    )
)


class MutantSglangTarget(MutatedTarget, SglangTarget):
    """SGLang's radix cache with one deliberate bug, active inside its calls and its observation."""

    catalogue = MUTANTS
    what = "SGLang mutant"

    def observe(self) -> Any:
        with self.active():
            return super().observe()


def make_mutant_target(name: str) -> MutantSglangTarget:
    return MutantSglangTarget(name)
