"""The one record of a deliberate bug, shared by every catalogue (``harness.mutants.registry.all_mutants``).

A ``Mutant`` names the bug (``--target mutant:NAME``), the kind of target it mutates, what the slip
is, the family whose runs show it, the modes ``kvspec mutants`` runs it in (``harness.campaign``),
the check written to catch it (if one is), and how it is applied: a ``Patch``, one attribute
replaced by a wrapper around the original for as long as the mutant is active.  No mutant copies
the code it breaks: each wrapper changes the arguments, the result or one collaborator of the call.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

from kvspec.harness.core.ops import Op
from kvspec.harness.targets.adapter import ManagerAdapter
from kvspec.spec.config import KVCacheConfig

TargetKind = Literal["spec", "impl", "vllm", "vllm-scheduler", "vllm-engine", "sglang"]
TARGET_KINDS: tuple[TargetKind, ...] = get_args(TargetKind)

Mode = Literal["exact", "outcomes", "invariants", "self"]
"""``exact`` / ``outcomes`` / ``invariants``: the mutant is the target, compared with the unmutated
spec under that equality relation (``harness.core.equality``); ``self``: the spec itself, reference
included, carries the bug, so only the invariants (which keep the original code) can see it."""
MODES: tuple[Mode, ...] = get_args(Mode)

Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


@dataclass(frozen=True)
class Patch:
    """``owner.attr`` replaced by ``wrap(original)``.  ``owner`` is a module (``spec.block_pool``)
    or a class in one (``vllm.v1.core.block_pool:BlockPool``), imported only when applied."""

    owner: str
    attr: str
    wrap: Wrap = field(repr=False)

    def resolve(self) -> Any:
        """The module or class holding the original."""
        module, _, cls = self.owner.partition(":")
        found = importlib.import_module(module)
        return getattr(found, cls) if cls else found


@dataclass(frozen=True)
class Mutant:
    """One deliberate bug of one catalogue."""

    name: str
    target: TargetKind
    doc: str  # the slip, on one line
    family: str  # the family whose runs show it (a scheduler driver family for vllm-scheduler)
    modes: tuple[Mode, ...]
    intended: str | None  # the check written to catch it, if one is
    patch: Patch


def doc_of(wrap: Wrap) -> str:
    """A wrapper's docstring on one line: the slip it makes."""
    return " ".join((wrap.__doc__ or "").split())


def by_name(mutants: tuple[Mutant, ...]) -> dict[str, Mutant]:
    """A catalogue keyed by name (a name given twice is refused)."""
    out = {m.name: m for m in mutants}
    assert len(out) == len(mutants), f"duplicate mutant names in {[m.name for m in mutants]}"
    return out


@contextmanager
def patched_class(patch: Patch) -> Iterator[None]:
    """``patch`` applied on its class (every instance, for the ``with`` block), restored on exit."""
    cls = patch.resolve()
    original = cls.__dict__[patch.attr]
    setattr(cls, patch.attr, patch.wrap(original))
    try:
        yield
    finally:
        setattr(cls, patch.attr, original)


class MutatedTarget(ManagerAdapter[Any]):
    """What every mutant target shares, mixed in before its adapter (``class M(MutatedTarget,
    SpecTarget)``, naming its ``catalogue``): a name the catalogue knows (else a ``ValueError``
    naming ``what`` it is), ``mutant:NAME`` as its name, the bug in its version, and the bug active
    only inside its ``reset`` and ``apply`` calls (``active``), so an unmutated target is untouched."""

    catalogue: ClassVar[Mapping[str, Mutant]]
    what: ClassVar[str] = "mutant"  # in the error naming an unknown one

    def __init__(self, mutant: str) -> None:
        if mutant not in self.catalogue:
            raise ValueError(f"unknown {self.what} {mutant!r} (known: {', '.join(sorted(self.catalogue))})")
        super().__init__()
        self.mutant = mutant
        self.name = f"mutant:{mutant}"

    def active(self) -> AbstractContextManager[None]:
        """The mutant applied, as a context: its patch on its class (a catalogue may patch otherwise)."""
        return patched_class(self.catalogue[self.mutant].patch)

    @property
    def version(self) -> str:
        return f"{super().version} with deliberate bug {self.mutant}"

    def reset(self, config: KVCacheConfig) -> None:
        with self.active():  # a mutant may live in the pool's construction
            super().reset(config)

    def apply(self, op: Op) -> Any:
        with self.active():
            return super().apply(op)
