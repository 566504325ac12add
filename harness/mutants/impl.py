"""Deliberate allocator bugs in kvspec's ``impl`` allocator, for showing the KV-content oracle works.

Each mutant is ``harness.targets.impl.ImplTarget`` with one method of the allocator (or of the
adapter) replaced by a wrapper around the original on its class, for the duration of each ``reset``
and ``apply`` and restored after it (``harness.mutants.record.patched_class``), so an unmutated
``impl`` target in the same process is untouched.  They are bugs of the kinds the issue names; the
oracle (``harness.oracle.target``) must catch each from wrong numbers alone, with no spec comparison:

- ``reuse_while_referenced``: ``BlockPool.free_blocks`` returns every block of the freed request to
  the free queue, including a prefix block another request still references (its ``ref_cnt`` stays
  above zero); the next allocation hands it out while the other request still reads it.
- ``hash_before_write``: ``allocate_slots`` caches the request's full blocks up to ``need_slot``
  (lookahead slots included) instead of ``min(total + num_new_tokens, num_tokens)``, and ignores
  ``delay_cache_blocks``; another request can hit blocks whose KV no chunk (or connector) has
  written yet.
- ``window_off_by_one``: ``SlidingWindowManager`` counts ``n - W + 2`` tokens as out of the window
  (vLLM 0.33 ``get_num_skipped_tokens``: ``n - W + 1``), so the block holding the oldest token
  still inside the window is dropped one token early.  (The opposite slip, ``n - W``, keeps a
  block one token too long: a leak the spec comparison sees but KV contents cannot.)
- ``hash_ignores_lora``: block hashes leave out the LoRA extra key, so requests with the same
  tokens under different adapters share blocks: a hit on a block holding another adapter's KV.

``make_mutant_target(name)`` builds one; ``MUTANTS`` holds their records, each naming the ledger
invariant that catches it (tests/ledger/test_ledger_mutants.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from kvspec.harness.core.book import BookRequest
from kvspec.harness.mutants.record import Mutant, MutatedTarget, Patch, Wrap, by_name
from kvspec.harness.targets.impl import ImplTarget
from kvspec.impl import allocator as alloc


def _queue_referenced(orig: Callable[..., Any]) -> Callable[..., Any]:
    def free_blocks(self: Any, ordered: Iterable[int]) -> None:
        """``BlockPool.free_blocks`` that queues every freed block, referenced or not (the bug)."""
        ref, key = self.ref, self.key
        front: list[int] = []
        back: list[int] = []
        for b in ordered:
            if b == alloc.NULL:
                continue
            ref[b] -= 1
            if self.prev[b] >= 0:  # already queued: linking it twice would corrupt the queue
                continue
            # BUG: vLLM 0.33 queues a block only when its ref_cnt reaches 0.
            (back if key[b] is not None and self.enable_caching else front).append(b)
        self._prepend_n(front)
        self._append_n(back)

    return free_blocks


def _hash_before_write(orig: Callable[..., Any]) -> Callable[..., Any]:
    def allocate_slots(self: Any, req: alloc.Request, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
        """``allocate_slots`` that caches up to the end of the allocated slots (the bug)."""
        local = req.num_computed_tokens + kwargs.get("num_new_computed_tokens", 0)
        total = min(local + kwargs.get("num_external_computed_tokens", 0), self.max_model_len)
        need_slot = min(total + num_new_tokens + kwargs.get("num_lookahead_tokens", 0), self.max_model_len)
        kwargs["delay_cache_blocks"] = True  # suppress the correct caching ...
        new = orig(self, req, num_new_tokens, *args, **kwargs)
        if new is not None:
            # BUG: vLLM 0.33 caches min(total + num_new_tokens, num_tokens), and nothing under
            # delay_cache_blocks; this publishes lookahead blocks and blocks still being loaded.
            self.cache_blocks(req, min(need_slot, req.num_tokens))
        return new

    return allocate_slots


def _window_off_by_one(orig: Callable[..., Any]) -> Callable[..., Any]:
    def skipped_tokens(self: Any, n: int) -> int:
        return max(0, n - int(self.window) + 2)  # BUG: vLLM 0.33 skips n - W + 1

    return skipped_tokens


def _hash_ignores_lora(orig: Callable[..., Any]) -> Callable[..., Any]:
    def _rehash(self: Any, native: alloc.Request, r: BookRequest) -> None:
        orig(self, native, dataclasses.replace(r, lora=None))  # BUG: the LoRA key is left out of the hashes

    return _rehash


def _impl_mutant(name: str, doc: str, family: str, intended: str, owner: str, attr: str, wrap: Wrap) -> Mutant:
    return Mutant(name, "impl", doc, family, ("exact",), intended, Patch(owner, attr, wrap))


# ``intended``: the ledger invariant that catches it first (tests/ledger/test_ledger_mutants.py).
MUTANTS: dict[str, Mutant] = by_name(
    (
        _impl_mutant(
            "reuse_while_referenced",
            "free_blocks queues a block another request still references",
            "full",
            "kv_read_written",
            "kvspec.impl.allocator.block_pool:BlockPool",
            "free_blocks",
            _queue_referenced,
        ),
        _impl_mutant(
            "hash_before_write",
            "allocate_slots publishes block hashes before the chunk (or load) writes their KV",
            "full",
            "kv_publish_written",
            "kvspec.impl.allocator.kv_cache_manager:KVCacheManager",
            "allocate_slots",
            _hash_before_write,
        ),
        _impl_mutant(
            "window_off_by_one",
            "sliding window skips n - W + 2 tokens (one too many): a block dropped early",
            "sliding_window",
            "kv_read_in_real_block",
            "kvspec.impl.allocator.single_type_managers:SlidingWindowManager",
            "skipped_tokens",
            _window_off_by_one,
        ),
        _impl_mutant(
            "hash_ignores_lora",
            "block hashes omit the LoRA key: hits on another adapter's KV",
            "full",
            "kv_read_own_kv",
            "kvspec.harness.targets.impl:ImplTarget",
            "_rehash",
            _hash_ignores_lora,
        ),
    )
)


class MutantImplTarget(MutatedTarget, ImplTarget):
    """``ImplTarget`` with one deliberate allocator bug (see the module docstring)."""

    catalogue = MUTANTS
    what = "impl mutant"


def make_mutant_target(name: str) -> MutantImplTarget:
    """A fresh ``impl`` target carrying the deliberate bug ``name``."""
    return MutantImplTarget(name)
