"""The pytest plugin: a team's suite runs kvspec against its manager (``--kvspec-target``, or the
``kvspec`` fixture), under the loaded Hypothesis profile; a finding is a failed test naming its report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ci_helpers import env

FIXTURE_TESTS = """
def test_my_manager_keeps_the_invariants(kvspec):
    kvspec.check("examples.my_manager:make_target", family="no_cache", relation="invariants")


def test_a_deliberate_bug_is_reported(kvspec):
    kvspec.check("mutant:hits_not_touched", family="full")


def test_the_teams_own_test():
    assert 1 + 1 == 2
"""


def pytest_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rfEs",
            "--hypothesis-profile",
            "kvspec-dev",
            "--kvspec-shrink-seconds",
            "2",
            *args,
        ],
        cwd=tmp_path,
        env=env(),
        text=True,
        capture_output=True,
        timeout=300,
    )


def test_a_users_manager_runs_from_pytest(tmp_path):
    r = pytest_run(
        tmp_path,
        "--kvspec-target",
        "examples.my_manager:make_target",
        "--kvspec-family",
        "no_cache",
        "--kvspec-relation",
        "invariants",
        "--kvspec-only",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed" in r.stdout


def test_a_mutant_fails_with_its_report(tmp_path):
    r = pytest_run(
        tmp_path,
        "--kvspec-target",
        "mutant:hits_not_touched",
        "--kvspec-family",
        "full",
        "--kvspec-only",
        "--kvspec-out",
        "reports",
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "TestKVSpec_full" in r.stdout and "kvspec: divergence at step" in r.stdout
    (report,) = (tmp_path / "reports").iterdir()
    assert f"report: reports/{report.name}" in r.stdout and (report / "trace.json").is_file()


def test_the_fixture_and_the_teams_own_tests_run_together(tmp_path):
    (tmp_path / "test_team.py").write_text(FIXTURE_TESTS)
    r = pytest_run(
        tmp_path,
        "test_team.py",
        "--kvspec-target",
        "examples.my_manager:make_target",
        "--kvspec-family",
        "no_cache",
        "--kvspec-relation",
        "invariants",
        "--kvspec-out",
        "reports",
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 failed, 3 passed" in r.stdout, r.stdout  # the team's own, the fixture's good check, TestKVSpec_no_cache
    assert "FAILED test_team.py::test_a_deliberate_bug_is_reported" in r.stdout
    assert "report: reports/kvspec-mutant-hits_not_touched-full-divergence" in r.stdout


def test_a_bad_target_is_a_usage_error(tmp_path):
    r = pytest_run(tmp_path, "--kvspec-target", "no.such.module:make", "--kvspec-only")
    assert r.returncode == 4 and "kvspec: --target 'no.such.module:make': module 'no' not found" in r.stderr, r.stderr
    r = pytest_run(tmp_path, "--kvspec-target", "spec", "--kvspec-family", "fullish", "--kvspec-only")
    assert r.returncode == 4 and "fullish" in r.stderr, r.stderr


def test_without_the_option_nothing_is_added(tmp_path):
    (tmp_path / "test_team.py").write_text("def test_x():\n    pass\n")
    r = pytest_run(tmp_path, "test_team.py")
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout


def test_a_family_the_target_models_nothing_of_is_skipped_not_passed(tmp_path):
    """The example declines every config with prefix caching on: its ``full`` test checked nothing."""
    r = pytest_run(tmp_path, "-rs", "--kvspec-target", "examples.my_manager:make_target", "--kvspec-family", "full")
    assert r.returncode == 0 and "1 skipped" in r.stdout and "passed" not in r.stdout, r.stdout
    assert "models no config of family full: TinyManager has no prefix cache" in r.stdout
