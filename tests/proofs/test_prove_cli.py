"""``kvspec prove``: the table, exit codes, and counterexample reports that replay as traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvspec.harness.proofs as proofs
from kvspec.harness.proofs import UNKNOWN, Claim, Outcome, prove_main
from kvspec.harness.traces.trace import read_trace
from kvspec.spec import arith

pytestmark = pytest.mark.proof


def test_proves_selected_claims_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results.json"
    assert prove_main(["sliding_window", "keys.block_key_injective", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "sliding_window.remove_skipped" in table and "sliding_window.hit_rule" in table
    assert "allocate_slots" not in table
    data = json.loads(out.read_text())
    assert [c["name"] for c in data["claims"]] == [
        "sliding_window.remove_skipped",
        "sliding_window.hit_rule",
        "keys.block_key_injective",
    ]
    assert all(c["status"] == "proven" for c in data["claims"])


def test_unknown_claim_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert prove_main(["no.such.claim"]) == 2
    err = capsys.readouterr().err
    assert "unknown claim 'no.such.claim'" in err and "allocate_slots.table_length" in err


def test_counterexample_exits_1_and_writes_a_replayable_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        arith, "get_num_new_blocks_to_allocate", lambda n, bs, held: arith.maximum(0, arith.floordiv(n, bs) + 1 - held)
    )
    assert prove_main(["allocate_slots.table_length", "--out", str(tmp_path)]) == 1
    assert "counterexample" in capsys.readouterr().out
    folder = tmp_path / "allocate_slots.table_length"
    report = json.loads((folder / "counterexample.json").read_text())
    assert report["status"] == "counterexample" and report["trace"] == "trace.json"
    trace = read_trace(folder / "trace.json")
    model = report["model"]
    assert trace.config.max_model_len == model["M"]
    assert trace.config.groups[0].block_size == model["bs"]
    last = trace.ops[-1]
    assert last.op == "allocate_slots" and last.num_new_tokens == model["n"]
    assert trace.finding is not None and trace.finding["claim"] == "allocate_slots.table_length"


def test_solver_unknown_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    stuck = Claim("stuck.claim", "never decided", (), lambda t: Outcome(UNKNOWN, detail="timeout"))
    monkeypatch.setattr(proofs, "all_claims", lambda: [stuck])
    monkeypatch.setattr("kvspec.harness.proofs.cli.all_claims", lambda: [stuck])
    assert prove_main([]) == 2


def test_list_shows_premises(capsys: pytest.CaptureFixture[str]) -> None:
    assert prove_main(["--list", "chunked_local.hit_start"]) == 0
    out = capsys.readouterr().out
    assert "premise: attention_chunk_size is a multiple of block_size" in out
