"""``kvspec releases`` and ``kvspec releases diff`` (harness/releases), run as a user runs them."""

from __future__ import annotations

import json

import pytest

from kvspec.harness.cli import main
from kvspec.harness.releases.cli import render_list
from kvspec.harness.traces.trace import trace_from_json
from kvspec.spec.releases.line import RELEASES


def test_the_list_names_every_release_and_the_installed_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["releases"]) == 0
    out = capsys.readouterr().out
    for release in RELEASES:
        assert f"  {release} " in out
    assert "0.34.0   changes: hit_limit_from_logprob_start" in out
    assert "0.34.0   changes: hit_limit_from_logprob_start  (installed)" in render_list("0.34.0")
    assert "is not a release kvspec models" in render_list("0.35.0")


def test_diff_names_the_change_an_upgrade_makes(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """0.33.0 -> 0.34.0 meets the 0.34 hit limit: exit 1, the change named with both outcomes, and
    the smallest trace written (a trace file kvspec reads back)."""
    argv = ["0.33.0", "0.34.0", "--seconds", "40", "--seed", "1", "--family", "full", "--out", str(tmp_path)]
    code = main(["releases", "diff", *argv])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "change 1: hit_limit_from_logprob_start" in out
    assert "    0.33.0: {" in out and "    0.34.0: {" in out
    assert "1 behaviour change(s) met (get_computed_blocks 1) of 1 modelled" in out
    trace = json.loads((tmp_path / "releases-diff-0.33.0-0.34.0" / "hit_limit_from_logprob_start.json").read_text())
    parsed = trace_from_json(trace)
    assert parsed.config.profile.release == "0.33.0"
    assert trace["finding"]["op"]["op"] == "get_computed_blocks"
    assert any(s.get("prompt_logprob_start") is not None for s in trace["steps"])  # what 0.34 reads differently


def test_diff_of_a_release_with_itself_finds_nothing(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["releases", "diff", "0.34.0", "0.34.0", "--seconds", "3", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no behaviour change met" in out and " 0 examples" not in out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["0.34.0", "0.35.0"], "nearest: 0.34.0"),
        (["0.22.0", "0.34.0"], "nearest: 0.23.0"),
        (["0.33.0", "0.34.0", "--seconds", "0"], "--seconds must be > 0"),
        (["0.33.0", "0.34.0", "--family", "nope"], "nope"),
    ],
)
def test_bad_input_is_exit_2_naming_the_problem(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["releases", "diff", *argv]) == 2
    assert says in capsys.readouterr().err
