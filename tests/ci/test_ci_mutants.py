"""``kvspec mutants``: the campaign table, a user's own mutants through ``module:mutants``, exit 1 on a
survivor, the runtime vLLM mutants, and (slow) the whole built-in catalogue with every mutant killed."""

from __future__ import annotations

import os
import re

import pytest
from ci_helpers import REPO, kvspec

from kvspec.harness.campaign import Entry, Row, builtin_entries, check_of, run_entry, select, uncovered, user_entries
from kvspec.harness.run.options import MutantsOptions

FAST = ("--seconds", "30", "--shrink-seconds", "1", "--out", "reports")


@pytest.mark.full  # about 14 s; a surviving mutant failing the campaign stays in the default tier
def test_campaign_table_names_the_killing_checks(tmp_path):
    r = kvspec("mutants", "--only", "free_order_appended,null_block_queued", *FAST, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    lines = lines[next(i for i, ln in enumerate(lines) if ln.startswith("mutant ")) :]
    assert lines[0].split() == [
        "mutant",
        "origin",
        "mode",
        "family",
        "killed",
        "killed",
        "by",
        "1st",
        "failure",
        "report",
        "cold",
        "shrunk",
        "reduced",
    ]
    rows = {
        (ln.split()[0], ln.split()[2]): ln
        for ln in lines[2:]
        if ln and not ln.startswith(("kvspec", "start to report"))
    }
    assert "divergence: observation/free_queue" in rows[("free_order_appended", "exact")]
    assert "reference-invariant: free_order" in rows[("free_order_appended", "self")]
    assert "reference-invariant: null_block_is_inert" in rows[("null_block_queued", "self")]
    assert all(" yes " in row for row in rows.values())
    assert "3/3 killed" in r.stdout and len(list((tmp_path / "reports").iterdir())) == 3
    for row in rows.values():  # the cold figure adds a fresh process' start-up to the time to report
        report, cold = (float(x.rstrip("s")) for x in re.findall(r"(\d+\.\d)s", row)[1:3])
        assert cold > report, row
    assert "start to report (in this process): median" in r.stdout
    assert re.search(r"start to report from a cold start: median [\d.]+s, worst [\d.]+s \(.*spec [\d.]+s", r.stdout)


def test_a_users_mutants_are_registered_through_module_mutants(tmp_path):
    r = kvspec(
        "mutants",
        "--target",
        "examples.my_manager:make_target",
        "--mutants",
        "examples.my_manager_mutants:mutants",
        "--family",
        "no_cache",
        "--relation",
        "invariants",
        "--control-seconds",
        "2",
        *FAST,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "invariant: free_iff_unreferenced" in r.stdout and "2/2 killed" in r.stdout


def test_a_surviving_mutant_fails_the_campaign(tmp_path):
    (tmp_path / "my_noop_mutants.py").write_text(
        "from examples.my_manager import make_target\n\ndef mutants():\n    return {'not_a_bug': make_target}\n"
    )
    r = kvspec(
        "mutants",
        "--target",
        "examples.my_manager:make_target",
        "--mutants",
        "my_noop_mutants:mutants",
        "--family",
        "no_cache",
        "--relation",
        "invariants",
        "--control-seconds",
        "1",
        "--seconds",
        "2",
        "--out",
        "reports",
        cwd=tmp_path,
        PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}",
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "not_a_bug" in r.stdout and " NO " in r.stdout and "0/1 killed" in r.stdout


def test_bad_registrations_are_usage_errors(tmp_path):
    r = kvspec(
        "mutants", "--target", "examples.my_manager:make_target", "--mutants", "examples.my_manager:nope", cwd=tmp_path
    )
    assert r.returncode == 2 and "has no attribute 'nope'" in r.stderr, r.stderr
    with pytest.raises(ValueError, match="has no attribute 'mutants'"):  # the default: <target module>:mutants
        user_entries("examples.my_manager:make_target", None, ("full",), "exact")
    with pytest.raises(ValueError, match="expected a non-empty dict"):
        user_entries("examples.my_manager:make_target", "examples.my_manager:make_target", ("full",), "exact")
    with pytest.raises(ValueError, match="unknown mutant\\(s\\) no_such_mutant"):
        select(builtin_entries(with_vllm=False), "no_such_mutant")


def test_check_names_and_uncovered_checks():
    assert check_of({"kind": "invariant", "invariant": "hash_chain"}) == "invariant: hash_chain"
    assert check_of({"kind": "divergence", "message": "outcome differs: x"}) == "divergence: outcome"
    assert (
        check_of({"kind": "divergence", "message": "state differs after the operation: free queue differs from 0"})
        == "divergence: observation/free_queue"
    )
    e = Entry("m", "spec", "self", "mutant:m", ("full",), object)
    rest = uncovered(
        [Row(e, True, "reference-invariant: conservation"), Row(e, True, "divergence: outcome"), Row(e, False)]
    )
    assert "conservation" not in rest and "outcome" not in rest and "observation" in rest and "hash_chain" in rest


@pytest.mark.vllm
def test_a_runtime_vllm_mutant_is_killed_and_vllm_restored(tmp_path):
    pytest.importorskip("vllm")
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    from kvspec.harness.mutants.vllm import patched

    original = KVCacheManager.__dict__["get_computed_blocks"]
    with patched("vllm_hit_cap_num_tokens"):
        assert KVCacheManager.__dict__["get_computed_blocks"] is not original
    assert KVCacheManager.__dict__["get_computed_blocks"] is original
    (entry,) = [e for e in builtin_entries(with_vllm=True) if e.name == "vllm_hit_cap_num_tokens"]
    opts = MutantsOptions(seconds=30, shrink_seconds=1, reduce_seconds=5.0, out=str(tmp_path))
    row = run_entry(entry, opts)
    assert row.killed and row.check == "divergence: outcome", row
    assert row.reduced_steps is not None and row.shrunk_steps is not None and row.reduced_steps <= row.shrunk_steps
    assert KVCacheManager.__dict__["get_computed_blocks"] is original


@pytest.mark.full
@pytest.mark.mutant
def test_the_whole_catalogue_is_killed(tmp_path):
    r = kvspec("mutants", "--seconds", "60", "--shrink-seconds", "3", "--out", "reports", cwd=tmp_path, timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "checks that killed no mutant" in r.stdout


@pytest.mark.full  # about 20 s; the whole campaign (full tier) runs every scheduler row too
def test_a_scheduler_mutant_is_a_campaign_row_with_a_reduced_report(tmp_path):
    pytest.importorskip("vllm")
    from vllm.v1.core.sched.scheduler import Scheduler

    from kvspec.harness.mutants.vllm_scheduler import MUTANTS

    entries = [e for e in builtin_entries(with_vllm=True) if e.origin == "scheduler"]
    assert sorted(e.name for e in entries) == sorted(MUTANTS)
    assert select(entries, "origin:scheduler") == entries
    (entry,) = [e for e in entries if e.name == "hit_off_by_one"]
    before = dict(Scheduler.__dict__)
    opts = MutantsOptions(seconds=30, seed=0, reduce_seconds=5.0, out=str(tmp_path))
    row = run_entry(entry, opts)
    assert row.killed and row.report is not None and (row.report / "trace.json").is_file(), row
    assert row.first_failure is not None and row.to_report is not None and row.first_failure <= row.to_report
    assert row.reduced_steps is not None and row.shrunk_steps is not None and row.reduced_steps <= row.shrunk_steps
    assert dict(Scheduler.__dict__) == before  # the patch is gone
    # The reduced report replays to its finding on the unpatched real manager.
    r = kvspec("replay", str(row.report), "--target", "vllm", cwd=tmp_path)
    assert r.returncode == 1 and "FAIL" in r.stdout, r.stdout + r.stderr
