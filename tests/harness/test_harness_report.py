"""Report folders: atomic, complete, replayable; drawings show the numbers."""

import dataclasses
import os
import subprocess
import sys

from kvspec.harness.cli import main
from kvspec.harness.core import ops as O
from kvspec.harness.core.ops_json import op_to_json
from kvspec.harness.traces.report import draw_token_layout, write_report
from kvspec.harness.traces.trace import Trace, read_trace
from kvspec.spec.config import KVCacheConfig, full_attention


def _finding_trace() -> Trace:
    config = KVCacheConfig(6, (full_attention(2),), 16)
    steps = [
        (O.AddRequest("r1", (1, 2, 3)), None),
        (O.GetComputedBlocks("r1"), {"block_ids": [[]], "num_hit_tokens": 0}),
        (O.AllocateSlots("r1", 3, use_computed_blocks=True), {"block_ids": [[1, 2]]}),
    ]
    finding = {
        "kind": "divergence",
        "step": 2,
        "message": "outcome differs",
        "op": op_to_json(steps[2][0]),
        "expected": {"block_ids": [[1, 2]]},
        "actual": {"block_ids": [[2, 1]]},
        "requests": ["r1"],
        "blocks": [1, 2],
    }
    return Trace(config, steps, "spec", "", seed=5, profile="dev", family="full", finding=finding)


def test_report_folder_is_complete_and_leaves_no_temp(tmp_path):
    path = write_report(tmp_path, _finding_trace())
    replay_file = "test_replay_" + path.name.replace("-", "_") + ".py"
    assert sorted(p.name for p in path.iterdir()) == sorted(["report.md", replay_file, "trace.json"])
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    md = (path / "report.md").read_text()
    assert "The target diverged from the spec at step 2" in md
    assert "| comp=0 | new_comp=0 | ext_comp=0 | new=3 | lookahead=0 |" in md
    assert "block      1    2" in md
    assert read_trace(path).steps == _finding_trace().steps


def test_second_report_gets_a_new_name(tmp_path):
    a = write_report(tmp_path, _finding_trace())
    b = write_report(tmp_path, _finding_trace())
    assert a != b and b.exists()


def test_a_replacing_report_takes_the_old_ones_place(tmp_path):
    """A known bug's report is the latest run's: the new folder replaces the old under its name,
    leaving nothing beside it."""
    a = write_report(tmp_path, _finding_trace(), name="known-K1-x")
    (a / "stale").write_text("an earlier run's")
    later = dataclasses.replace(_finding_trace(), seed=99)
    b = write_report(tmp_path, later, name="known-K1-x", replace=True)
    assert b == a and not (b / "stale").exists() and read_trace(b).seed == 99
    assert [p.name for p in tmp_path.iterdir()] == ["known-K1-x"]


def test_generated_pytest_file_replays(tmp_path):
    path = write_report(tmp_path, _finding_trace())
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path)],
        capture_output=True,
        text=True,
        cwd=".",
    )
    assert r.returncode == 0, r.stdout + r.stderr  # recorded outcomes are the spec's: it behaves as recorded


def test_generated_pytest_file_fails_when_its_target_cannot_be_loaded(tmp_path):
    trace = dataclasses.replace(_finding_trace(), target_name="sglang")
    path = write_report(tmp_path, trace)
    env = {**os.environ, "KVSPEC_SGLANG_VENV": str(tmp_path / "no-venv")}  # the target is not there
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 1, r.stdout + r.stderr  # failed, not skipped: a broken adapter is not a green corpus
    assert "cannot be loaded here, so the trace was not replayed" in r.stdout


def test_token_layout_numbers():
    lines = draw_token_layout(
        O.AllocateSlots("r", 5, num_new_computed_tokens=4, num_external_computed_tokens=2, num_lookahead_tokens=1),
        3,
        12,
    )
    assert lines[1].split() == "| comp=3 | new_comp=4 | ext_comp=2 | new=5 | lookahead=1 |".split()
    assert "[3,7)" in lines[2] and "[14,15)" in lines[2]


def test_report_command_prints(tmp_path, capsys):
    path = write_report(tmp_path, _finding_trace())
    assert main(["report", str(path)]) == 0
    assert "kvspec report: divergence" in capsys.readouterr().out
