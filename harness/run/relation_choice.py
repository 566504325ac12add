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

    def line(self, ledger: bool = True) -> str:
        """``relation R (why); the KV ledger is on``: the first line of a run."""
        return f"relation {self.relation} ({self.why}); the KV ledger is {'on' if ledger else 'off (--no-ledger)'}"


def choose_relation(given: str | None, entry: CatalogueEntry) -> RelationChoice:
    """The relation for the target of ``entry``, ``given`` on the command line or None."""
    if given is not None:
        return RelationChoice(given, "--relation given")
    if entry.relation is not None:
        return RelationChoice(entry.relation, entry.relation_reason)
    target = entry.name
    declared = _declared(target, entry.factory)
    if declared is not None:
        return declared
    return RelationChoice(
        "invariants",
        f"target {target} declares no relation, so it is taken to be a manager that is not vLLM; "
        "declare relation = 'exact' on it, or pass --relation exact, to compare it with vLLM block for block",
    )


def _declared(target: str, factory: Callable[[], Any] | None) -> RelationChoice | None:
    """The ``relation`` (and ``relation_reason``) the factory or a target it builds declares."""
    from kvspec.harness.core.equality import RELATIONS

    if factory is None:
        return None
    holder: Any = factory
    if getattr(holder, "relation", None) is None:
        try:
            holder = factory()
        except (Exception, SystemExit):  # the loader built one already; one failing now fails the run later
            return None
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
