"""Deliberate bugs in the worked example's manager, registered for ``kvspec mutants``.

``kvspec mutants --target examples.my_manager:make_target --mutants examples.my_manager_mutants:mutants
--family no_cache --relation invariants`` fuzzes each one and fails (exit 1) if one survives: the
same ``module:callable`` protocol as targets, where the callable returns ``{name: factory}`` (or
``{name: (factory, family)}``) and each factory builds the adapter with one bug.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from examples.my_manager import TinyManager, TinyTarget


class _LeakyFree(TinyManager):
    def free(self, request_id: str) -> None:
        for b in reversed(self.tables.pop(request_id, [])):
            self.ref_cnt[b] -= 1  # BUG: the block never goes back to the free list


class _FreeKeepsRefs(TinyManager):
    def free(self, request_id: str) -> None:
        for b in reversed(self.tables.pop(request_id, [])):
            self.free_list.insert(0, b)  # BUG: ref count left at 1


def _target_with(manager_cls: type[TinyManager]) -> Callable[[], TinyTarget]:
    class Mutant(TinyTarget):
        def reset(self, config: Any) -> None:
            super().reset(config)
            self.manager.__class__ = manager_cls

    return Mutant


def mutants() -> dict[str, Callable[[], Any]]:
    return {
        "leaky_free": _target_with(_LeakyFree),
        "free_keeps_refs": _target_with(_FreeKeepsRefs),
    }
