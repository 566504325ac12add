"""Which equality relation a run uses, and why: the first line of ``kvspec fuzz``, ``kvspec mutants
--target`` and ``pytest --kvspec-target`` says it.

- ``--relation`` (``--kvspec-relation``, the fixture's ``relation=``) given: that one;
- else the target's own declaration: a target (its factory, or the object the factory builds) may
  carry ``relation = "exact" | "outcomes" | "invariants"`` and ``relation_reason = "..."``
  (docs/targets.md); ``examples/my_manager.py`` declares ``invariants``;
- else the relation the target's catalogue entry gives (``harness.run.catalogue``: the built-in
  targets that model vLLM block for block, ``spec``, ``vllm``, ``impl``, ``vllm-scheduler`` and
  ``mutant:NAME``, get ``exact``; ``vllm-fixed``, vLLM with proposed fixes, different by design,
  ``invariants``);
- else (a ``package.module:factory`` that declares nothing: a manager that is not vLLM):
  ``invariants``, the spec's invariants and the KV ledger on the target's own state.

A declared relation that is not one of ``harness.core.equality.RELATIONS`` is a ``UsageError``.
The same line says which invariants are in force: the engine-neutral ones and the policy of the
target's engine (the catalogue entry's ``engine``, else the target's ``engine`` attribute, else vLLM).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvspec.harness.run.options import UsageError

if TYPE_CHECKING:
    from kvspec.harness.run.catalogue import CatalogueEntry


@dataclass(frozen=True)
class RelationChoice:
    relation: str
    why: str
    engine: str = "vllm"

    def line(self, ledger: bool = True) -> str:
        """``relation R (why); invariants: ...; the KV ledger is on``: the line of a run that says
        what is compared and which invariants are in force (``invariant_set``)."""
        state = "on" if ledger else "off (--no-ledger)"
        invariants = invariant_set(self.engine)
        return f"relation {self.relation} ({self.why}); invariants: {invariants}; the KV ledger is {state}"


def invariant_set(engine: str) -> str:
    """Which invariants a target of ``engine`` is held to: ``17 engine-neutral + 3 vllm-policy state
    invariants`` (``spec.invariants``: a policy invariant of another engine is not checked)."""
    from kvspec.spec.invariants import SPEC_INVARIANTS

    state = [inv for inv in SPEC_INVARIANTS.in_force(engine) if inv.kind == "state"]
    neutral = sum(inv.engines is None for inv in state)
    policy = len(state) - neutral
    own = f" + {policy} {engine}-policy" if policy else f" (engine {engine}: no policy invariants of its own)"
    return f"{neutral} engine-neutral{own} state invariants"


def choose_relation(given: str | None, entry: CatalogueEntry) -> RelationChoice:
    """The relation for the target of ``entry``, ``given`` on the command line or None, and the
    engine whose invariants are in force (the entry's; a built-in target that names none is vLLM's
    kind; a user's target says with its ``engine``)."""
    engine = entry.engine or ("vllm" if entry.builtin else _declared_engine(entry.factory))
    if given is not None:
        return RelationChoice(given, "--relation given", engine)
    if entry.relation is not None:
        return RelationChoice(entry.relation, entry.relation_reason, engine)
    target = entry.name
    declared = _declared(target, entry.factory)
    if declared is not None:
        return RelationChoice(declared.relation, declared.why, engine)
    return RelationChoice(
        "invariants",
        f"target {target} declares no relation, so it is taken to be a manager that is not vLLM; "
        "declare relation = 'exact' on it, or pass --relation exact, to compare it with vLLM block for block",
        engine,
    )


def _holder(factory: Callable[[], Any] | None, attribute: str) -> Any:
    """The factory if it carries ``attribute``, else a target it builds (None if that fails)."""
    if factory is None or getattr(factory, attribute, None) is not None:
        return factory
    try:
        return factory()
    except (Exception, SystemExit):  # the loader built one already; one failing now fails the run later
        return None


def _declared_engine(factory: Callable[[], Any] | None) -> str:
    """The engine the factory or a target it builds declares (``harness.targets.base.get_target_engine``)."""
    from kvspec.harness.targets.base import get_target_engine

    holder = _holder(factory, "engine")
    return "vllm" if holder is None else get_target_engine(holder)


def _declared(target: str, factory: Callable[[], Any] | None) -> RelationChoice | None:
    """The ``relation`` (and ``relation_reason``) the factory or a target it builds declares."""
    from kvspec.harness.core.equality import RELATIONS

    holder = _holder(factory, "relation")
    relation = getattr(holder, "relation", None)
    if relation is None:
        return None
    if not isinstance(relation, str) or relation not in RELATIONS:
        raise UsageError(
            f"target {target} declares relation {relation!r}, which is not one of {', '.join(RELATIONS)} "
            "(docs/targets.md)"
        )
    reason = getattr(holder, "relation_reason", None)
    said = f": {reason}" if isinstance(reason, str) and reason.strip() else ""
    return RelationChoice(relation, f"declared by target {target}{said}")
