"""The relation a run uses when ``--relation`` is left out: the target's declaration, else exact for
the built-in vLLM-like targets and invariants for a manager that is not vLLM; ``--relation`` wins;
the run's first lines say which and why (``harness.run.relation_choice``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from examples.my_manager import TinyTarget
from kvspec.harness.run.catalogue import CatalogueEntry, resolve
from kvspec.harness.run.options import UsageError
from kvspec.harness.run.relation_choice import choose_relation, invariant_set
from kvspec.harness.targets.spec import SpecTarget

EXAMPLE = "examples.my_manager:make_target"
REPO = Path(__file__).resolve().parents[2]


def kvspec(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("KVSPEC_DB", None)
    return subprocess.run(
        [sys.executable, "-m", "kvspec.harness", *args], cwd=cwd, env=env, text=True, capture_output=True, timeout=120
    )


def test_the_example_declares_invariants_and_says_why():
    c = choose_relation(None, CatalogueEntry(EXAMPLE, TinyTarget))
    assert c.relation == "invariants"
    assert c.why == f"declared by target {EXAMPLE}: {TinyTarget.relation_reason}"


def test_a_given_relation_wins_over_the_declaration():
    c = choose_relation("exact", CatalogueEntry(EXAMPLE, TinyTarget))
    assert (c.relation, c.why) == ("exact", "--relation given")


def test_built_in_targets_are_exact_and_vllm_fixed_is_not():
    for name in ("spec", "impl", "mutant:free_order_appended", "mutant:window_off_by_one"):
        assert choose_relation(None, resolve(name)).relation == "exact", name
    pytest.importorskip("vllm", reason="the vLLM targets need vLLM")
    for name in ("vllm", "vllm-scheduler", "mutant:hits_not_touched"):
        assert choose_relation(None, resolve(name)).relation == "exact", name
    assert choose_relation(None, resolve("vllm-fixed")).relation == "invariants"


def test_a_user_target_that_declares_nothing_gets_the_invariants():
    c = choose_relation(
        None, CatalogueEntry("mypkg.adapter:make_target", SpecTarget)
    )  # SpecTarget declares no relation
    assert c.relation == "invariants" and "declares no relation" in c.why


def test_a_declaration_on_the_factory_or_on_what_it_builds():
    def factory() -> SpecTarget:
        return SpecTarget()

    factory.relation = "outcomes"  # type: ignore[attr-defined]
    assert choose_relation(None, CatalogueEntry("m:f", factory)).relation == "outcomes"

    class Declares(SpecTarget):
        def __init__(self) -> None:
            super().__init__()
            self.relation = "exact"

    assert choose_relation(None, CatalogueEntry("m:f", Declares)).relation == "exact"


def test_a_bad_declaration_is_a_usage_error():
    class Bad(SpecTarget):
        relation = "roughly"

    with pytest.raises(UsageError, match="declares relation 'roughly', which is not one of exact"):
        choose_relation(None, CatalogueEntry("m:Bad", Bad))


def test_the_first_lines_of_a_run_say_the_relation(tmp_path):
    r = kvspec("fuzz", "--target", EXAMPLE, "--family", "no_cache", "--seconds", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    second = r.stderr.splitlines()[1]
    assert second == (
        f"kvspec fuzz: relation invariants (declared by target {EXAMPLE}: {TinyTarget.relation_reason}); "
        f"invariants: {invariant_set('vllm')}; the KV ledger is on"
    )
    args = ("--target", EXAMPLE, "--family", "no_cache", "--seconds", "2")
    r = kvspec("fuzz", *args, "--relation", "exact", cwd=tmp_path)
    assert r.returncode == 1 and "relation exact (--relation given)" in r.stderr, r.stderr
