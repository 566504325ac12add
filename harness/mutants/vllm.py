"""Runtime mutants of the installed vLLM 0.33.0: its real ``KVCacheManager`` with one small bug.

Each mutant is ``harness.targets.vllm.VllmTarget`` whose ``apply`` runs with one method of vLLM's
``BlockPool``, ``KVCacheManager`` or a single-type manager replaced by a wrapper around the original
(monkeypatched on the class for the duration of the call, and restored after it, so an unmutated
``vllm`` target in the same process is untouched).  No vLLM code is copied: each wrapper changes
the arguments, the result, or one collaborator of the original call.  They are the bugs of the spec
mutants (``harness.mutants.spec``) and of the regression corpus, made in the real manager:

- ``vllm_free_order_appended``: ``BlockPool.free_blocks`` appends the unhashed blocks too (the
  free queue's ``prepend_n`` is ``append_n``): the LIFO reuse of scratch blocks is lost;
- ``vllm_hit_cap_num_tokens``: ``KVCacheManager.get_computed_blocks`` caps the hit at
  ``num_tokens`` instead of ``num_tokens - 1``;
- ``vllm_swa_skip_n_minus_w``: ``SlidingWindowManager.get_num_skipped_tokens`` skips one token
  fewer (``n - W``): a block that left the window is kept a step too long;
- ``vllm_hits_not_touched``: ``BlockPool.touch`` does nothing: prefix hits are adopted without a
  reference (and stay in the free queue);
- ``vllm_cache_drafts``: ``KVCacheManager.allocate_slots`` sees the request's draft tokens as
  verified output, so blocks of unverified drafts get hashes and are published.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from kvspec.harness.mutants.record import Mutant, MutatedTarget, Patch, Wrap, by_name, patched_class
from kvspec.harness.targets.vllm import VllmTarget


def _free_order_appended(orig: Callable[..., Any]) -> Callable[..., Any]:
    def free_blocks(self: Any, ordered_blocks: Any) -> None:
        queue = self.free_block_queue
        queue.prepend_n = queue.append_n  # BUG: unhashed blocks go to the tail as well
        try:
            orig(self, ordered_blocks)
        finally:
            del queue.prepend_n

    return free_blocks


def _hit_cap_num_tokens(orig: Callable[..., Any]) -> Callable[..., Any]:
    def get_computed_blocks(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        coordinator = self.coordinator
        find = coordinator.find_longest_cache_hit

        def find_longer(block_hashes: Any, max_cache_hit_length: int, *rest: Any) -> Any:
            return find(block_hashes, max_cache_hit_length + 1, *rest)  # BUG: no token left to sample from

        # The cap is applied where the lookup is asked for, whichever release computed it.
        coordinator.find_longest_cache_hit = find_longer
        try:
            return orig(self, request, *args, **kwargs)
        finally:
            del coordinator.find_longest_cache_hit

    return get_computed_blocks


def _swa_skip_n_minus_w(orig: Callable[..., Any]) -> Callable[..., Any]:
    def get_num_skipped_tokens(self: Any, num_computed_tokens: int) -> int:
        return max(0, int(orig(self, num_computed_tokens)) - 1)  # BUG: n - W instead of n - W + 1

    return get_num_skipped_tokens


def _hits_not_touched(orig: Callable[..., Any]) -> Callable[..., Any]:
    def touch(self: Any, blocks: Any) -> None:
        return None  # BUG: hits keep their ref_cnt (and their place in the free queue)

    return touch


def _cache_drafts(orig: Callable[..., Any]) -> Callable[..., Any]:
    def allocate_slots(self: Any, request: Any, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
        drafts = list(request.spec_token_ids or ())
        if not drafts:
            return orig(self, request, num_new_tokens, *args, **kwargs)
        n_out, n_all, n_hash = len(request._output_token_ids), len(request._all_token_ids), len(request.block_hashes)
        request.spec_token_ids = []
        request.append_output_token_ids(drafts)  # BUG: drafts hashed and cached as if verified
        try:
            return orig(self, request, num_new_tokens, *args, **kwargs)
        finally:  # the request itself is put back as the scheduler left it
            del request._output_token_ids[n_out:]
            del request._all_token_ids[n_all:]
            del request.block_hashes[n_hash:]
            request.spec_token_ids = drafts

    return allocate_slots


def _vllm_mutant(name: str, doc: str, family: str, owner: str, attr: str, wrap: Wrap) -> Mutant:
    return Mutant(name, "vllm", doc, family, ("exact",), None, Patch(owner, attr, wrap))


MUTANTS: dict[str, Mutant] = by_name(
    (
        _vllm_mutant(
            "vllm_free_order_appended",
            "free_blocks appends unhashed blocks instead of prepending them",
            "full",
            "vllm.v1.core.block_pool:BlockPool",
            "free_blocks",
            _free_order_appended,
        ),
        _vllm_mutant(
            "vllm_hit_cap_num_tokens",
            "prefix hit capped at num_tokens, not num_tokens - 1",
            "full",
            "vllm.v1.core.kv_cache_manager:KVCacheManager",
            "get_computed_blocks",
            _hit_cap_num_tokens,
        ),
        _vllm_mutant(
            "vllm_swa_skip_n_minus_w",
            "sliding window skips n - W tokens",
            "sliding_window",
            "vllm.v1.core.single_type_kv_cache_manager:SlidingWindowManager",
            "get_num_skipped_tokens",
            _swa_skip_n_minus_w,
        ),
        _vllm_mutant(
            "vllm_hits_not_touched",
            "prefix hits adopted without touch",
            "full",
            "vllm.v1.core.block_pool:BlockPool",
            "touch",
            _hits_not_touched,
        ),
        _vllm_mutant(
            "vllm_cache_drafts",
            "draft tokens hashed and cached as verified tokens",
            "full",
            "vllm.v1.core.kv_cache_manager:KVCacheManager",
            "allocate_slots",
            _cache_drafts,
        ),
    )
)


def patched(name: str) -> AbstractContextManager[None]:
    """vLLM with mutant ``name`` applied (on the class), restored on exit."""
    return patched_class(MUTANTS[name].patch)


class MutantVllmTarget(MutatedTarget, VllmTarget):
    """The real vLLM ``KVCacheManager`` with one deliberate bug, active only inside its calls."""

    catalogue = MUTANTS
    what = "vLLM mutant"


def make_mutant_target(name: str) -> MutantVllmTarget:
    return MutantVllmTarget(name)
