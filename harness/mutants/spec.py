"""Deliberate bugs of the spec: the spec target with one small, realistic mistake (``--target mutant:NAME``).

Each mutant wraps one spec function while the mutant target runs (the reference spec, in the same
process, is untouched): the wrapper is installed in every ``spec.*`` module that holds the
original for the duration of one ``apply`` and removed afterwards.  The harness must report every
mutant within the ``ci`` profile (``tests/mutants``).  Each one is a mistake real managers made
(docs/semantics.md §10).  ``SPEC_MUTANTS`` adds the ones aimed at one invariant each
(``harness.mutants.invariants``); ``kvspec mutants`` runs these five both as the target and as the
spec itself.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from kvspec.harness.mutants.invariants import MUTANTS as INVARIANT_MUTANTS
from kvspec.harness.mutants.record import Mutant, MutatedTarget, Patch, Wrap, by_name, doc_of
from kvspec.harness.targets.spec import SpecTarget
from kvspec.spec import request as rq
from kvspec.spec.releases.line import FREE_ORDER_0_20


def _free_order_appended(orig: Callable[..., Any]) -> Callable[..., Any]:
    """§10.5: every freed block appended at the tail (the 0.20 order) instead of unhashed ones
    prepended: LIFO reuse of scratch blocks is lost, different block ids come back."""

    def free_blocks(pool: Any, ordered_blocks: Any, split: bool = True) -> Any:
        out = orig(dataclasses.replace(pool, profile=FREE_ORDER_0_20), ordered_blocks, split)
        return dataclasses.replace(out, profile=pool.profile)

    return free_blocks


def _hit_cap_num_tokens(orig: Callable[..., Any]) -> Callable[..., Any]:
    """§10.1: lookup capped at ``num_tokens`` instead of ``num_tokens - 1``: a block-aligned prompt
    hits entirely and nothing is left to sample from."""

    def get_computed_blocks(state: Any, request: Any) -> Any:
        longer = dataclasses.replace(request, output_token_ids=request.output_token_ids + (-1,))
        return orig(state, longer)

    return get_computed_blocks


def _swa_skip_n_minus_w(orig: Callable[..., Any]) -> Callable[..., Any]:
    """§10.2: sliding window skips ``n - W`` tokens instead of ``n - W + 1``: a block that has
    left the window is kept one step too long."""

    def get_num_skipped_tokens(spec: Any, num_computed_tokens: int) -> int:
        if spec.kind == "sliding_window":
            window: int = spec.sliding_window
            return max(0, num_computed_tokens - window)
        return int(orig(spec, num_computed_tokens))

    return get_num_skipped_tokens


def _hits_not_touched(orig: Callable[..., Any]) -> Callable[..., Any]:
    """§10.7 / M04: prefix hits adopted without ``touch``: their ref counts stay low and they stay in
    the free queue, where a new allocation can evict them."""

    def touch(pool: Any, blocks: Any) -> Any:
        return pool

    return touch


def _cache_drafts(orig: Callable[..., Any]) -> Callable[..., Any]:
    """§7 / §10.9: drafts treated as tokens when caching, so blocks holding unverified drafts get
    hashes (and later requests hit on tokens the model never produced)."""

    def allocate_slots(state: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        if request.spec_token_ids:
            request = rq.append_output_token_ids(
                dataclasses.replace(request, spec_token_ids=()), request.spec_token_ids
            )
        return orig(state, request, *args, **kwargs)

    return allocate_slots


def _spec_mutant(name: str, family: str, owner: str, attr: str, wrap: Wrap) -> Mutant:
    return Mutant(name, "spec", doc_of(wrap), family, ("exact", "self"), None, Patch(owner, attr, wrap))


MUTANTS: dict[str, Mutant] = by_name(
    (
        _spec_mutant(
            "free_order_appended",
            "full",
            "kvspec.spec.block_pool",
            "free_blocks",
            _free_order_appended,
        ),
        _spec_mutant(
            "hit_cap_num_tokens",
            "full",
            "kvspec.spec.kv_cache_manager",
            "get_computed_blocks",
            _hit_cap_num_tokens,
        ),
        _spec_mutant(
            "swa_skip_n_minus_w",
            "sliding_window",
            "kvspec.spec.managers",
            "get_num_skipped_tokens",
            _swa_skip_n_minus_w,
        ),
        _spec_mutant(
            "hits_not_touched",
            "full",
            "kvspec.spec.block_pool",
            "touch",
            _hits_not_touched,
        ),
        _spec_mutant(
            "cache_drafts",
            "full",
            "kvspec.spec.kv_cache_manager",
            "allocate_slots",
            _cache_drafts,
        ),
    )
)

SPEC_MUTANTS: dict[str, Mutant] = MUTANTS | INVARIANT_MUTANTS
"""Every mutant of the spec: these and ``harness.mutants.invariants``'."""


SPEC = "kvspec.spec"  # the package whose modules a spec mutant patches


@contextmanager
def patched_modules(patch: Patch, keep: tuple[str, ...] = ()) -> Iterator[None]:
    """``patch`` applied in every ``kvspec.spec.*`` module holding the original (``from m import f``
    copies it), except the modules under the prefixes ``keep``."""
    attr = patch.attr
    original = getattr(patch.resolve(), attr)
    replacement = patch.wrap(original)
    holders = [
        m
        for n, m in list(sys.modules.items())
        if (n == SPEC or n.startswith(SPEC + ".")) and not n.startswith(keep) and getattr(m, attr, None) is original
    ]
    for m in holders:
        setattr(m, attr, replacement)
    try:
        yield
    finally:
        for m in holders:
            setattr(m, attr, original)


def patched_spec(mutant: str, keep: tuple[str, ...] = ()) -> AbstractContextManager[None]:
    """The whole spec (every module but those under ``keep``) with ``mutant`` applied, as a context."""
    return patched_modules(SPEC_MUTANTS[mutant].patch, keep=keep)


class MutantTarget(MutatedTarget, SpecTarget):
    """The spec with one deliberate bug, active only inside this target's calls."""

    catalogue = SPEC_MUTANTS

    def active(self) -> AbstractContextManager[None]:
        """Every spec module holding the original (``patched_spec``), not one class."""
        return patched_spec(self.mutant)


def make_mutant(name: str) -> MutantTarget:
    return MutantTarget(name)
