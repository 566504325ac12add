"""Every catalogue of deliberate bugs holds ``Mutant`` records that the campaign, ``--target mutant:NAME``
and the tests can rely on (harness/mutants/record.py)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from kvspec.harness.campaign import builtin_entries
from kvspec.harness.core.equality import RELATIONS
from kvspec.harness.drivers.lockstep import LockstepDriver
from kvspec.harness.engine.workload import ENGINE_FAMILIES
from kvspec.harness.mutants import impl, invariants, sglang, spec, vllm, vllm_engine, vllm_scheduler
from kvspec.harness.mutants.record import MODES, TARGET_KINDS, Mutant, Patch, by_name, patched_class
from kvspec.harness.mutants.registry import all_mutants, find_mutant
from kvspec.harness.run.catalogue import resolve
from kvspec.harness.sglang.load import is_sglang_there, load_sglang
from kvspec.harness.targets import TargetLoadError
from kvspec.harness.vllm_sched.driver import SCHED_FAMILIES
from kvspec.harness.world.families import FAMILIES
from kvspec.spec.invariants import SPEC_INVARIANTS
from kvspec.spec.kv_ledger import LEDGER_INVARIANTS

CATALOGUES = {
    "spec": (spec.MUTANTS, "spec"),
    "invariants": (invariants.MUTANTS, "spec"),
    "impl": (impl.MUTANTS, "impl"),
    "vllm": (vllm.MUTANTS, "vllm"),
    "vllm_scheduler": (vllm_scheduler.MUTANTS, "vllm-scheduler"),
    "vllm_engine": (vllm_engine.MUTANTS, "vllm-engine"),
    "sglang": (sglang.MUTANTS, "sglang"),
}


@pytest.mark.parametrize("catalogue", sorted(CATALOGUES))
def test_every_entry_is_a_mutant_record_of_its_catalogues_target(catalogue: str) -> None:
    mutants, target = CATALOGUES[catalogue]
    assert mutants
    for name, m in mutants.items():
        assert isinstance(m, Mutant) and m.name == name and m.target == target
        assert m.doc and "\n" not in m.doc, name
        assert isinstance(m.patch, Patch) and m.patch.attr, name


def test_all_mutants_is_every_catalogue_once_with_unique_names() -> None:
    every = [m for mutants, _ in CATALOGUES.values() for m in mutants.values()]
    assert list(all_mutants()) == every
    names = [m.name for m in every]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert {m.target for m in every} == set(TARGET_KINDS)
    assert find_mutant("hash_before_write") is impl.MUTANTS["hash_before_write"] and find_mutant("nope") is None


def test_families_exist() -> None:
    for m in all_mutants():
        # the scheduler's and the engine's driver families
        known = {"vllm-scheduler": SCHED_FAMILIES, "vllm-engine": ENGINE_FAMILIES}.get(m.target, FAMILIES)
        assert m.family in known, f"{m.name}: unknown family {m.family!r}"


def test_modes_are_the_ones_the_campaign_knows() -> None:
    assert set(MODES) == set(RELATIONS) | {"self"}
    for m in all_mutants():
        assert m.modes and set(m.modes) <= set(MODES) and len(set(m.modes)) == len(m.modes), m.name
        # another engine is compared under the invariants relation only
        expected = ("invariants",) if m.target == "sglang" else ("exact",)
        assert m.target == "spec" or m.modes == expected, f"{m.name}: only the spec can run as itself"


def test_intended_checks_exist() -> None:
    for m in invariants.MUTANTS.values():
        assert m.intended is not None
        named = [w for w in m.intended.replace(",", " ").split() if not w.startswith("(")]
        assert all(n in SPEC_INVARIANTS or n == "events_replay" for n in named), m.intended
    for m in impl.MUTANTS.values():
        assert m.intended in LEDGER_INVARIANTS, m.name
    for m in sglang.MUTANTS.values():
        assert m.intended in SPEC_INVARIANTS or m.intended in LEDGER_INVARIANTS, m.name


def test_patches_name_an_attribute_of_their_owner() -> None:
    try:
        has_vllm = importlib.util.find_spec("vllm") is not None
    except ImportError:  # a broken install, or one hidden from this interpreter
        has_vllm = False
    for m in all_mutants():
        if m.target in ("vllm", "vllm-scheduler") and not has_vllm:
            continue
        if m.target == "vllm-engine":  # vLLM's CPU build, in the engine venv: tests/engine/test_engine_run.py
            continue
        if m.target == "sglang":  # SGLang's venv: found and loaded first (harness/sglang/load.py)
            if not is_sglang_there():
                continue
            load_sglang()
        owner = m.patch.resolve()
        assert m.patch.attr in vars(owner), f"{m.name}: {m.patch.owner} has no {m.patch.attr}"


def test_campaign_rows_are_one_per_mutant_and_mode() -> None:
    rows = [(e.name, e.origin, e.mode, e.target, e.families) for e in builtin_entries(True, with_engine=True)]
    origin = {"spec": "spec", "impl": "impl", "vllm": "vllm", "vllm-scheduler": "scheduler", "vllm-engine": "engine"}
    origin["sglang"] = "sglang"
    sglang_rows = len(sglang.MUTANTS) if is_sglang_there() else 0  # SGLang's 6 need the sglang venv
    want = [
        (m.name, origin[m.target], mode, f"mutant:{m.name}", (m.family,))
        for m in all_mutants()
        for mode in m.modes
        if m.target != "sglang" or sglang_rows
    ]
    assert rows == want and len(rows) == 55 + sglang_rows
    assert len(builtin_entries(True, with_engine=False)) == 51 + sglang_rows  # the engine's 4 need an engine venv
    assert len(builtin_entries(with_vllm=False)) == 36 + sglang_rows  # 5 spec x 2 modes, 21 aimed (one twice), 4 impl


def test_mutant_names_resolve_as_targets() -> None:
    for name in ("free_order_appended", "null_block_queued", "hash_ignores_lora"):
        entry = resolve(f"mutant:{name}")
        assert entry.factory().name == f"mutant:{name}" and entry.driver is LockstepDriver
    with pytest.raises(TargetLoadError, match="unknown mutant 'nope'.*free_order_appended"):
        resolve("mutant:nope")
    pytest.importorskip("vllm", reason="a scheduler mutant drives vLLM's real scheduler")
    entry = resolve("mutant:hit_off_by_one")  # run by the real scheduler's driver, the bug patched in
    assert entry.origin == "scheduler" and entry.driver is not LockstepDriver


def test_by_name_refuses_a_name_given_twice() -> None:
    m = spec.MUTANTS["cache_drafts"]
    with pytest.raises(AssertionError, match="duplicate"):
        by_name((m, m))


class _Owner:
    def f(self) -> int:
        return 1


def test_patched_class_applies_the_wrapper_and_restores_the_original() -> None:
    original = _Owner.__dict__["f"]

    def wrap(orig: Any) -> Any:
        return lambda self: orig(self) + 41

    with patched_class(Patch(f"{__name__}:_Owner", "f", wrap)):
        assert _Owner().f() == 42
    assert _Owner.__dict__["f"] is original and _Owner().f() == 1
