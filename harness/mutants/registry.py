"""Deliberate bugs: the spec target with one small, realistic mistake (``--target mutant:NAME``).

Each mutant wraps one spec function while the mutant target runs (the reference spec, in the same
process, is untouched): the wrapper is installed in every ``spec.*`` module that holds the
original for the duration of one ``apply`` and removed afterwards.  The harness must report every
mutant within the ``ci`` profile (``tests/mutants``).  Each one is a mistake real managers made
(docs/semantics.md §10).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from harness.core import ops as O
from harness.targets.spec import SpecTarget
from spec import block_pool, kv_cache_manager, managers
from spec import request as rq
from spec.config import Profile


def _free_order_appended(orig: Callable[..., Any]) -> Callable[..., Any]:
    """§10.5: every freed block appended at the tail (the 0.20 order) instead of unhashed ones
    prepended: LIFO reuse of scratch blocks is lost, different block ids come back."""

    def free_blocks(pool: Any, ordered_blocks: Any) -> Any:
        out = orig(dataclasses.replace(pool, profile=Profile.V0_20), ordered_blocks)
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


# name -> (module holding the original, function name, wrapper factory)
MUTANTS: dict[str, tuple[Any, str, Callable[[Callable[..., Any]], Callable[..., Any]]]] = {
    "free_order_appended": (block_pool, "free_blocks", _free_order_appended),
    "hit_cap_num_tokens": (kv_cache_manager, "get_computed_blocks", _hit_cap_num_tokens),
    "swa_skip_n_minus_w": (managers, "get_num_skipped_tokens", _swa_skip_n_minus_w),
    "hits_not_touched": (block_pool, "touch", _hits_not_touched),
    "cache_drafts": (kv_cache_manager, "allocate_slots", _cache_drafts),
}

# The family (and the scheduler features) in which each mutant shows; tests fuzz exactly there.
MUTANT_FAMILIES = {
    "free_order_appended": "full",
    "hit_cap_num_tokens": "full",
    "swa_skip_n_minus_w": "sliding_window",
    "hits_not_touched": "full",
    "cache_drafts": "full",
}


# The modes in which ``kvspec mutants`` runs each one (harness.campaign): ``exact`` as the target
# against the unmutated spec; ``self`` as the spec itself (reference included), where only the
# invariants can see it.
MUTANT_MODES: dict[str, tuple[str, ...]] = {
    "free_order_appended": ("exact", "self"),
    "hit_cap_num_tokens": ("exact", "self"),
    "swa_skip_n_minus_w": ("exact", "self"),
    "hits_not_touched": ("exact", "self"),
    "cache_drafts": ("exact", "self"),
}


@contextmanager
def _patched(module: Any, name: str, wrapper: Callable[..., Any], keep: tuple[str, ...] = ()) -> Iterator[None]:
    """``module.name`` replaced by ``wrapper(original)`` in every ``spec.*`` module holding it, except
    the modules under the prefixes ``keep``."""
    original = getattr(module, name)
    replacement = wrapper(original)
    holders = [
        m
        for n, m in list(sys.modules.items())
        if (n == "spec" or n.startswith("spec.")) and not n.startswith(keep) and getattr(m, name, None) is original
    ]
    for m in holders:
        setattr(m, name, replacement)
    try:
        yield
    finally:
        for m in holders:
            setattr(m, name, original)


def spec_mutant(mutant: str) -> tuple[Any, str, Callable[[Callable[..., Any]], Callable[..., Any]]] | None:
    """(module, function, wrapper) of a spec mutant: this catalogue, or ``harness.mutants.invariants``."""
    from harness.mutants import invariants as mutants_invariants

    return MUTANTS.get(mutant) or mutants_invariants.MUTANTS.get(mutant)


def patched_spec(mutant: str, keep: tuple[str, ...] = ()) -> Any:
    """The whole spec (every module but those under ``keep``) with ``mutant`` applied, as a context."""
    found = spec_mutant(mutant)
    assert found is not None, mutant
    return _patched(*found, keep=keep)


class MutantTarget(SpecTarget):
    """The spec with one deliberate bug, active only inside this target's calls."""

    def __init__(self, mutant: str) -> None:
        super().__init__()
        if spec_mutant(mutant) is None:
            raise ValueError(f"unknown mutant {mutant!r} (known: {', '.join(sorted(MUTANTS))})")
        self.mutant = mutant
        self.name = f"mutant:{mutant}"

    @property
    def version(self) -> str:
        return f"{super().version} with deliberate bug {self.mutant}"

    def apply(self, op: O.Op) -> Any:
        with patched_spec(self.mutant):
            return super().apply(op)

    def reset(self, config: Any) -> None:
        with patched_spec(self.mutant):  # a mutant may live in the pool's construction
            super().reset(config)


def make_mutant(name: str) -> MutantTarget:
    return MutantTarget(name)


def is_builtin_target(name: str) -> bool:
    """Does ``resolve_target`` resolve ``name`` by registry lookup alone: a built-in target of
    ``harness.targets`` (``spec``, ``vllm``, ``impl``), ``vllm-fixed``, or ``mutant:NAME`` (looked up
    in the mutant catalogues; an unknown one is a ``TargetLoadError``)?  Any other name is
    ``package.module:factory``: code that resolving it imports and calls, which ``kvspec replay``
    takes from the command line only, never from a trace file."""
    from harness.targets import is_builtin

    return is_builtin(name) or name == "vllm-fixed" or name.startswith("mutant:")


def resolve_target(name: str) -> Callable[[], Any]:
    """``--target`` as the CLI reads it: ``mutant:NAME`` names a deliberate bug of this catalogue
    (a spec mutant above, or an ``impl`` allocator mutant of ``harness.mutants.impl``); any other
    name goes to the production registry ``harness.targets``."""
    from harness.targets import TargetLoadError, check_target, target_factory

    if name == "vllm-fixed":  # vLLM with the proposed fixes of known bugs (harness.mutants.fixes_vllm)
        target_factory("vllm")  # says why when vLLM 0.33.0 is not installed
        from harness.mutants.fixes_vllm import make_target

        return make_target
    if not name.startswith("mutant:"):
        return target_factory(name)
    from harness.mutants import impl as mutants_impl
    from harness.mutants import vllm as mutants_vllm

    mname = name.split(":", 1)[1]
    factory: Callable[[], Any]
    if spec_mutant(mname) is not None:
        factory = lambda: make_mutant(mname)  # noqa: E731
    elif mname in mutants_impl.MUTANTS:
        factory = lambda: mutants_impl.make_mutant_target(mname)  # noqa: E731
    elif mname in mutants_vllm.MUTANTS:
        target_factory("vllm")  # says why when vLLM 0.33.0 is not installed
        factory = lambda: mutants_vllm.make_mutant_target(mname)  # noqa: E731
    else:
        from harness.mutants import invariants as mutants_invariants

        known = ", ".join(sorted([*MUTANTS, *mutants_invariants.MUTANTS, *mutants_impl.MUTANTS, *mutants_vllm.MUTANTS]))
        raise TargetLoadError(f"unknown mutant {mname!r} (known: {known})")
    check_target(factory, name)
    return factory
