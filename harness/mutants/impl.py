"""Deliberate allocator bugs in kvspec's ``impl`` allocator, for showing the KV-content oracle works.

Each mutant is ``harness.targets.impl.ImplTarget`` with one piece of ``impl.allocator`` replaced
after ``reset`` (the pool's or a manager's class is swapped for a subclass that overrides one
method).  They are bugs of the kinds the issue names; the oracle (``harness.oracle.target``) must catch
each from wrong numbers alone, with no spec comparison:

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

``make_mutant_target(name)`` builds one; ``MUTANTS`` maps names to one-line descriptions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from harness.core.book import BookRequest
from harness.targets.impl import ImplTarget
from impl import allocator as alloc
from spec.config import KVCacheConfig

MUTANTS: dict[str, str] = {
    "reuse_while_referenced": "free_blocks queues a block another request still references",
    "hash_before_write": "allocate_slots publishes block hashes before the chunk (or load) writes their KV",
    "window_off_by_one": "sliding window skips n - W + 2 tokens (one too many): a block dropped early",
    "hash_ignores_lora": "block hashes omit the LoRA key: hits on another adapter's KV",
}

# The family in which each one shows (``kvspec mutants`` fuzzes it there).
MUTANT_FAMILIES: dict[str, str] = {
    "reuse_while_referenced": "full",
    "hash_before_write": "full",
    "window_off_by_one": "sliding_window",
    "hash_ignores_lora": "full",
}


class _QueueReferencedPool(alloc.BlockPool):
    """``free_blocks`` that queues every freed block, referenced or not (the bug)."""

    def free_blocks(self, ordered: Iterable[int]) -> None:
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


class _HashBeforeWriteManager(alloc.KVCacheManager):
    """``allocate_slots`` that caches up to the end of the allocated slots (the bug)."""

    def allocate_slots(self, req: alloc.Request, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
        local = req.num_computed_tokens + kwargs.get("num_new_computed_tokens", 0)
        total = min(local + kwargs.get("num_external_computed_tokens", 0), self.max_model_len)
        need_slot = min(total + num_new_tokens + kwargs.get("num_lookahead_tokens", 0), self.max_model_len)
        kwargs["delay_cache_blocks"] = True  # suppress the correct caching ...
        new = super().allocate_slots(req, num_new_tokens, *args, **kwargs)
        if new is not None:
            # BUG: vLLM 0.33 caches min(total + num_new_tokens, num_tokens), and nothing under
            # delay_cache_blocks; this publishes lookahead blocks and blocks still being loaded.
            self.cache_blocks(req, min(need_slot, req.num_tokens))
        return new


class _WindowOffByOneManager(alloc.SlidingWindowManager):
    def skipped_tokens(self, n: int) -> int:
        return max(0, n - self.window + 2)  # BUG: vLLM 0.33 skips n - W + 1


class MutantImplTarget(ImplTarget):
    """``ImplTarget`` with one deliberate allocator bug (see the module docstring)."""

    def __init__(self, mutant: str) -> None:
        if mutant not in MUTANTS:
            raise ValueError(f"unknown impl mutant {mutant!r} (known: {', '.join(sorted(MUTANTS))})")
        super().__init__()
        self.mutant = mutant
        self.name = f"mutant:{mutant}"

    @property
    def version(self) -> str:
        return f"kvspec impl with deliberate bug {self.mutant!r}"

    def reset(self, config: KVCacheConfig) -> None:
        super().reset(config)
        m = self._manager
        assert m is not None
        if self.mutant == "reuse_while_referenced":
            m.pool.__class__ = _QueueReferencedPool
        elif self.mutant == "hash_before_write":
            m.__class__ = _HashBeforeWriteManager
        elif self.mutant == "window_off_by_one":
            for g in m.managers:
                if type(g) is alloc.SlidingWindowManager:
                    g.__class__ = _WindowOffByOneManager

    def _rehash(self, native: alloc.Request, r: BookRequest) -> None:
        if self.mutant == "hash_ignores_lora":
            r = dataclasses.replace(r, lora=None)  # BUG: the LoRA key is left out of the hashes
        super()._rehash(native, r)


def make_mutant_target(name: str) -> MutantImplTarget:
    """A fresh ``impl`` target carrying the deliberate bug ``name``."""
    return MutantImplTarget(name)
