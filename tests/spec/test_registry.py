"""``spec.registry.Registry``: the one type of the spec's, the ledger's and the P/D invariant sets."""

from __future__ import annotations

import pytest

from kvspec.harness.pd.invariants import PD_INVARIANTS
from kvspec.spec.invariants import SPEC_INVARIANTS
from kvspec.spec.kv_ledger import LEDGER_INVARIANTS
from kvspec.spec.registry import Invariant, Registry


def small_registry() -> Registry[int, str]:
    """Three predicates over an int, registered out of alphabetical order."""
    reg: Registry[int, str] = Registry("test invariant", ("even", "odd"))

    @reg.register("R2", "odd")
    def positive(n: int) -> str | None:
        """Is positive."""
        return None if n > 0 else f"{n} <= 0"

    @reg.register("R1", "even")
    def below_ten(n: int) -> str | None:
        return None if n < 10 else f"{n} >= 10"

    @reg.register("R3", "even")
    def not_seven(n: int) -> str | None:
        return None if n != 7 else "7"

    return reg


def test_duplicate_names_are_refused() -> None:
    reg = small_registry()

    def positive(n: int) -> str | None:
        return None

    with pytest.raises(AssertionError, match="duplicate test invariant positive"):
        reg.register("R9", "odd")(positive)
    assert reg["positive"].rule == "R2"  # the first one stays


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(AssertionError, match="kind 'both'"):
        small_registry().register("R9", "both")


def test_order_is_registration_order_and_lookup_is_by_name() -> None:
    reg = small_registry()
    assert list(reg) == ["positive", "below_ten", "not_seven"]
    assert len(reg) == 3 and "below_ten" in reg and "nope" not in reg
    inv = reg["positive"]
    assert isinstance(inv, Invariant)
    assert (inv.name, inv.rule, inv.kind, inv.doc) == ("positive", "R2", "odd", "Is positive.")
    with pytest.raises(KeyError):
        reg["nope"]


def test_check_returns_the_broken_ones_with_witnesses_in_registration_order() -> None:
    reg = small_registry()
    assert reg.check(5) == []
    found = reg.check(-20)  # breaks positive only; 12 breaks below_ten only
    assert [(inv.name, w) for inv, w in found] == [("positive", "-20 <= 0")]
    assert [inv.name for inv, _ in reg.check(7)] == ["not_seven"]
    reg.register("R4", "odd")(lambda n: "always")
    assert [inv.name for inv, _ in reg.check(12)] == ["below_ten", "<lambda>"]


def test_check_filters_by_name_and_kind() -> None:
    reg = small_registry()
    assert [inv.name for inv, _ in reg.check(-20, names=["below_ten"])] == []
    assert [inv.name for inv, _ in reg.check(-20, names=["positive"])] == ["positive"]
    assert reg.check(-20, kinds=("even",)) == []
    assert [inv.name for inv, _ in reg.check(-20, kinds=("odd",))] == ["positive"]


@pytest.mark.parametrize(
    "registry, kinds",
    [
        (SPEC_INVARIANTS, ("state", "step")),
        (LEDGER_INVARIANTS, ("write", "read", "publish")),
        (PD_INVARIANTS, ("event", "state", "idle")),
    ],
)
def test_the_three_sets_are_registries(registry: Registry[object, object], kinds: tuple[str, ...]) -> None:
    assert isinstance(registry, Registry) and registry.kinds == kinds
    assert len(registry) > 0
    for name, inv in registry.items():
        assert inv.name == name and inv.kind in kinds and inv.rule and inv.check.__name__ == name


def test_the_three_sets_have_distinct_names() -> None:
    assert len({r.what for r in (SPEC_INVARIANTS, LEDGER_INVARIANTS, PD_INVARIANTS)}) == 3
