"""Every catalogue of deliberate bugs, in one list.

The target catalogue (``harness.run.catalogue.resolve``) turns ``mutant:NAME`` into a target through
``find_mutant`` and ``mutant_factory``; ``all_mutants`` lists every catalogue's
``Mutant`` records (``harness.mutants.record``): the spec's (``spec``, ``invariants``), the ``impl``
allocator's (``impl``), vLLM's manager's (``vllm``), vLLM's scheduler's (``vllm_scheduler``), the engine path's
(``vllm_engine``) and SGLang's radix cache's (``sglang``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvspec.harness.mutants.record import Mutant


def all_mutants() -> tuple[Mutant, ...]:
    """Every built-in mutant, catalogue by catalogue (the campaign's row order).  Importing the vLLM
    and SGLang catalogues is free: vLLM and SGLang are imported only when a mutant is applied."""
    from kvspec.harness.mutants import impl, sglang, spec, vllm, vllm_engine, vllm_scheduler

    return (
        *spec.SPEC_MUTANTS.values(),
        *impl.MUTANTS.values(),
        *vllm.MUTANTS.values(),
        *vllm_scheduler.MUTANTS.values(),
        *vllm_engine.MUTANTS.values(),
        *sglang.MUTANTS.values(),
    )


def find_mutant(name: str) -> Mutant | None:
    """The built-in mutant called ``name``, if there is one."""
    return next((m for m in all_mutants() if m.name == name), None)


def mutant_factory(mutant: Mutant) -> Callable[[], Any]:
    """A zero-argument factory of fresh targets carrying ``mutant`` (not a scheduler mutant: those
    mutate the scheduler ``harness.vllm_sched`` drives, not a target)."""
    from kvspec.harness.mutants import impl, sglang, spec, vllm

    make: dict[str, Callable[[str], Any]] = {
        "spec": spec.make_mutant,
        "impl": impl.make_mutant_target,
        "vllm": vllm.make_mutant_target,
        "sglang": sglang.make_mutant_target,
    }
    assert mutant.target in make, mutant

    def factory() -> Any:
        return make[mutant.target](mutant.name)

    return factory
