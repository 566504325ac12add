"""What a fuzz run tells CI besides its exit status (harness/run/ci_output.py): a SARIF 2.1.0 log,
GitHub workflow commands under Actions, and the step summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvspec.harness.cli import main
from kvspec.harness.run.ci_output import Outcome, github_annotations, sarif_log


def check_sarif(log: dict) -> None:
    """The parts of SARIF 2.1.0 a code-scanning service needs, checked by hand (the OASIS schema is
    not vendored here): version, one run with a named tool, results whose rules the tool lists."""
    assert log["version"] == "2.1.0" and log["$schema"].endswith("sarif-2.1.0.json")
    (run,) = log["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "kvspec" and driver["version"]
    rules = {r["id"] for r in driver["rules"]}
    for r in run["results"]:
        assert r["ruleId"] in rules and r["level"] in ("error", "warning") and r["message"]["text"]
        for loc in r.get("locations", []):
            assert loc["physicalLocation"]["artifactLocation"]["uri"].endswith("report.md")


def test_a_sarif_log_lists_each_outcome_under_its_rule():
    outcomes = [
        Outcome("invariant/conservation", "error", "t", "invariant at step 3", Path("r/a"), "kvspec replay r/a"),
        Outcome("known-bug/K1", "warning", "t", "known bug K1", None, None, "docs/upstream/x.md"),
    ]
    log = sarif_log(outcomes, "0.1.0")
    check_sarif(log)
    run = log["runs"][0]
    assert [r["level"] for r in run["results"]] == ["error", "warning"]
    assert run["invocations"] == [{"executionSuccessful": False}]
    assert sarif_log(outcomes[1:], "0.1.0")["runs"][0]["invocations"] == [{"executionSuccessful": True}]


def test_annotations_escape_what_the_runner_would_misread():
    (line,) = github_annotations([Outcome("k", "error", "a: b, c", "50% of\nit", Path("r"), "kvspec replay r")])
    assert line.startswith("::error title=a%3A b%2C c,file=r/report.md::")
    assert "50%25 of%0Ait" in line and "\n" not in line


@pytest.fixture
def github(tmp_path, monkeypatch):
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    return summary


def test_a_finding_is_an_error_annotation_a_sarif_error_and_a_step_summary(tmp_path, capsys, github):
    sarif = tmp_path / "k.sarif"
    args = ["fuzz", "--target", "mutant:hit_cap_num_tokens", "--seconds", "20", "--seed", "1"]
    assert main([*args, "--out", str(tmp_path / "r"), "--sarif", str(sarif)]) == 1
    out = capsys.readouterr().out
    (error,) = [line for line in out.splitlines() if line.startswith("::error ")]
    log = json.loads(sarif.read_text())
    check_sarif(log)
    (result,) = [r for r in log["runs"][0]["results"] if r["level"] == "error"]
    report = Path(result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"])
    assert report.is_file() and f"file={report.as_posix()}" in error
    summary = github.read_text()
    assert "**The run failed on a finding**" in summary and result["properties"]["replay"] in summary


def test_known_bugs_are_warnings_and_a_clean_run_says_so(tmp_path, capsys, github, monkeypatch):
    monkeypatch.delenv("KVSPEC_STRICT_KNOWN", raising=False)
    sarif = tmp_path / "k.sarif"
    args = ["fuzz", "--target", "spec", "--family", "sliding_window", "--seconds", "5", "--seed", "1"]
    assert main([*args, "--out", str(tmp_path / "r"), "--sarif", str(sarif)]) == 0
    out = capsys.readouterr().out
    assert "::warning title=kvspec%3A known bug K1" in out and "::error" not in out
    log = json.loads(sarif.read_text())
    check_sarif(log)
    assert {r["level"] for r in log["runs"][0]["results"]} == {"warning"}
    assert log["runs"][0]["invocations"] == [{"executionSuccessful": True}]
    assert "No finding" in github.read_text() and "known bug K1" in github.read_text()


def test_outside_github_nothing_is_annotated_and_a_bad_sarif_path_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    args = ["fuzz", "--target", "spec", "--family", "full", "--seconds", "1", "--out", str(tmp_path / "r")]
    assert main(args) == 0
    assert not any(line.startswith("::") for line in capsys.readouterr().out.splitlines())
    assert main([*args, "--sarif", str(tmp_path)]) == 2
    assert "--sarif" in capsys.readouterr().err
