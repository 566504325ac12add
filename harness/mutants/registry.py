"""The built-in target names ``--target`` resolves, and every catalogue of deliberate bugs.

``resolve_target`` turns ``vllm-fixed`` and ``mutant:NAME`` into target factories and hands any
other name to the production registry ``harness.targets``; ``all_mutants`` lists every catalogue's
``Mutant`` records (``harness.mutants.record``): the spec's (``spec``, ``invariants``), the ``impl``
allocator's (``impl``), vLLM's manager's (``vllm``) and vLLM's scheduler's (``vllm_scheduler``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.mutants.record import Mutant


def all_mutants() -> tuple[Mutant, ...]:
    """Every built-in mutant, catalogue by catalogue (the campaign's row order).  Importing the vLLM
    catalogues is free: vLLM itself is imported only when a mutant is applied."""
    from harness.mutants import impl, spec, vllm, vllm_scheduler

    return (
        *spec.SPEC_MUTANTS.values(),
        *impl.MUTANTS.values(),
        *vllm.MUTANTS.values(),
        *vllm_scheduler.MUTANTS.values(),
    )


def find_mutant(name: str) -> Mutant | None:
    """The built-in mutant called ``name``, if there is one."""
    return next((m for m in all_mutants() if m.name == name), None)


def mutant_factory(mutant: Mutant) -> Callable[[], Any]:
    """A zero-argument factory of fresh targets carrying ``mutant`` (not a scheduler mutant: those
    mutate the scheduler ``harness.vllm_sched`` drives, not a target)."""
    from harness.mutants import impl, spec, vllm

    make: dict[str, Callable[[str], Any]] = {
        "spec": spec.make_mutant,
        "impl": impl.make_mutant_target,
        "vllm": vllm.make_mutant_target,
    }
    assert mutant.target in make, mutant

    def factory() -> Any:
        return make[mutant.target](mutant.name)

    return factory


def is_builtin_target(name: str) -> bool:
    """Does ``resolve_target`` resolve ``name`` by registry lookup alone: a built-in target of
    ``harness.targets`` (``spec``, ``vllm``, ``impl``), ``vllm-fixed``, or ``mutant:NAME`` (looked up
    in the mutant catalogues; an unknown one is a ``TargetLoadError``)?  Any other name is
    ``package.module:factory``: code that resolving it imports and calls, which ``kvspec replay``
    takes from the command line only, never from a trace file."""
    from harness.targets import is_builtin

    return is_builtin(name) or name == "vllm-fixed" or name.startswith("mutant:")


def resolve_target(name: str) -> Callable[[], Any]:
    """``--target`` as the CLI reads it: ``mutant:NAME`` names a deliberate bug of the spec, the
    ``impl`` allocator or vLLM's manager (``all_mutants``); ``vllm-fixed`` is vLLM with the proposed
    fixes; any other name goes to the production registry ``harness.targets``."""
    from harness.targets import TargetLoadError, check_target, target_factory

    if name == "vllm-fixed":  # vLLM with the proposed fixes of known bugs (harness.mutants.fixes_vllm)
        target_factory("vllm")  # says why when vLLM 0.33.0 is not installed
        from harness.mutants.fixes_vllm import make_target

        return make_target
    if not name.startswith("mutant:"):
        return target_factory(name)
    mutant = find_mutant(name.split(":", 1)[1])
    if mutant is None or mutant.target == "vllm-scheduler":
        known = ", ".join(sorted(m.name for m in all_mutants() if m.target != "vllm-scheduler"))
        raise TargetLoadError(f"unknown mutant {name.split(':', 1)[1]!r} (known: {known})")
    if mutant.target == "vllm":
        target_factory("vllm")  # says why when vLLM 0.33.0 is not installed
    factory = mutant_factory(mutant)
    check_target(factory, name)
    return factory
