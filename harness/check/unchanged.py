"""Skipping a state check whose inputs have not changed.

The spec's state predicates (``spec.invariants.check_invariants``) are a pure function of the spec's
state, its requests, whether eviction ran and the events taken so far.  Spec states and requests are
values: an operation that changes nothing (a prefix lookup, a failed allocation, a cache call with
nothing new to publish, about a quarter of all checks) leaves the very same objects in place, and
the check would only repeat the last one, which passed (a failing check ends the example).
``LastInputs`` remembers the inputs of the last check that passed, by identity.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

V = TypeVar("V")


class LastInputs:
    """The inputs of the last state check that passed."""

    def __init__(self) -> None:
        self.objects: tuple[Any, ...] | None = None  # compared by identity
        self.values: tuple[Any, ...] | None = None  # compared by equality

    def same(self, state: Any, requests: Mapping[Any, Any], *values: Any) -> bool:
        """Are ``state`` and every request the very objects of the last passed check, and ``values`` equal?"""
        objects = self.objects
        if objects is None or values != self.values or len(objects) != len(requests) + 1 or objects[0] is not state:
            return False
        return all(a is b for a, b in zip(objects[1:], requests.values()))

    def passed(self, state: Any, requests: Mapping[Any, Any], *values: Any) -> None:
        """Remember these inputs: a check on them found nothing."""
        self.objects, self.values = (state, *requests.values()), values

    def run(self, check: Callable[[], list[V]], state: Any, requests: Mapping[Any, Any], *values: Any) -> list[V]:
        """``check()``, unless its inputs are those of the last passed check (then nothing is found)."""
        if self.same(state, requests, *values):
            return []
        found = check()
        if not found:
            self.passed(state, requests, *values)
        return found
