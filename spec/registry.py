"""One registry type for every set of named invariants, generic in what its predicates read.

Three sets use it: the manager's own rules (``spec.invariants.SPEC_INVARIANTS``, docs/semantics.md
§9), the KV ledger's (``spec.kv_ledger.LEDGER_INVARIANTS``, §11) and the P/D safety rules
(``harness.pd.invariants.PD_INVARIANTS``, docs/pd-preallocation.md).  A predicate is registered
with ``@REGISTRY.register(rule, kind)``: ``rule`` cites the statement it checks, ``kind`` says
what it reads (one of the registry's ``kinds``), and ``engines`` (optional) names the engines whose
policy it states: an engine-neutral predicate (no ``engines``) holds for any correct KV cache, a
policy predicate only for the engines it names (``is_in_force``).  It takes a context and returns
``None`` when it holds, or a witness (a message, an access) when it does not.  The registry is a
read-only mapping from names to ``Invariant``s, in registration order, which is the order
violations are reported.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

C = TypeVar("C")  # what a predicate reads: a state, an operation, slot accesses, a cluster
W = TypeVar("W")  # what a broken predicate returns: a message, an access


@dataclass(frozen=True, slots=True)
class Invariant(Generic[C, W]):
    """One registered predicate: its name (the function's), the rule it cites, its kind, and the
    engines whose policy it states (``None``: engine-neutral)."""

    name: str
    rule: str
    kind: str
    check: Callable[[C], W | None] = field(repr=False)
    engines: tuple[str, ...] | None = None

    def is_in_force(self, engine: str | None) -> bool:
        """Checked on a target of ``engine``: it is engine-neutral, or it states that engine's policy
        (``engine`` None: every predicate, as on the spec itself)."""
        return engine is None or self.engines is None or engine in self.engines

    @property
    def doc(self) -> str:
        return (self.check.__doc__ or "").strip()


class Registry(Mapping[str, Invariant[C, W]]):
    """Named predicates of one set, in registration order; ``what`` names the set in messages."""

    def __init__(self, what: str, kinds: Collection[str]) -> None:
        self.what = what
        self.kinds = tuple(kinds)
        self._entries: dict[str, Invariant[C, W]] = {}
        self._by_kinds: dict[tuple[tuple[str, ...] | None, str | None], list[Invariant[C, W]]] = {}

    def register(
        self, rule: str, kind: str, engines: tuple[str, ...] | None = None
    ) -> Callable[[Callable[[C], W | None]], Callable[[C], W | None]]:
        """The decorator adding a predicate under its function's name (a second one is refused)."""
        assert kind in self.kinds, f"{self.what} kind {kind!r} (known: {', '.join(self.kinds)})"
        assert engines is None or (engines and all(engines)), f"{self.what}: engines {engines!r} names no engine"

        def add(fn: Callable[[C], W | None]) -> Callable[[C], W | None]:
            assert fn.__name__ not in self._entries, f"duplicate {self.what} {fn.__name__}"
            self._entries[fn.__name__] = Invariant(fn.__name__, rule, kind, fn, engines)
            self._by_kinds.clear()
            return fn

        return add

    def _selected(self, kinds: tuple[str, ...] | None, engine: str | None) -> list[Invariant[C, W]]:
        """The predicates of ``kinds`` (all when None) in force for ``engine``, in registration order
        (remembered until the next registration: a check runs after every step)."""
        found = self._by_kinds.get((kinds, engine))
        if found is None:
            found = self._by_kinds[kinds, engine] = [
                inv
                for inv in self._entries.values()
                if (kinds is None or inv.kind in kinds) and inv.is_in_force(engine)
            ]
        return found

    def __getitem__(self, name: str) -> Invariant[C, W]:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def in_force(self, engine: str | None) -> list[Invariant[C, W]]:
        """The predicates checked on a target of ``engine`` (``Invariant.is_in_force``)."""
        return [inv for inv in self._entries.values() if inv.is_in_force(engine)]

    def check(
        self,
        ctx: C,
        names: Collection[str] | None = None,
        kinds: Collection[str] | None = None,
        engine: str | None = None,
    ) -> list[tuple[Invariant[C, W], W]]:
        """Every broken predicate (of ``kinds``, or the named ones; those in force for ``engine``)
        with its witness, in registration order."""
        out = []
        for inv in self._selected(None if kinds is None else tuple(kinds), engine):
            if names is not None and inv.name not in names:
                continue
            witness = inv.check(ctx)
            if witness is not None:
                out.append((inv, witness))
        return out
