"""``kvspec replay`` on untrusted trace files: a trace never chooses code to run, and folders are
walked for traces only (exit 0 all behaved as recorded, 1 one departed, 2 bad usage or a bad file).

- The target comes from ``--target``; without it a trace's recorded target is used only if it is
  built in (``spec``, ``impl``, ``vllm``, ``mutant:NAME``); a recorded ``module:function`` is refused
  (exit 2, naming the trace, the target and both ways out) unless ``--trust-trace-target``.
- A folder is walked without entering hidden folders or virtualenvs; ``.json`` files that are not
  kvspec traces are skipped and listed on stderr; a damaged trace is exit 2 naming it.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvspec.harness.cli import main
from kvspec.harness.core.target_names import is_user_target
from kvspec.harness.run.catalogue import resolve
from kvspec.harness.targets import TargetLoadError

CORPUS = Path(__file__).parents[1] / "corpus"
FULL = CORPUS / "cache_drafts.json"  # one full-attention group
USER_MODULE = "kvspec_replay_safety_target"  # a user's adapter module, written by the fixture below


def _trace(tmp_path: Path, target: str, name: str = "trace.json", source: Path = FULL) -> Path:
    d = json.loads(source.read_text())
    d["target"]["name"] = target
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(d))
    return path


@pytest.fixture
def imports(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every module ``importlib.import_module`` is asked for (how ``harness.targets`` loads a
    ``module:function`` target); ``sys`` and ``os`` are refused, so ``sys:exit`` / ``os:abort``
    cannot run even if the check under test is gone (the recorded call still fails the test)."""
    calls: list[str] = []
    real = importlib.import_module

    def spy(name: str, package: str | None = None) -> Any:
        calls.append(name)
        if name in ("sys", "os"):
            raise AssertionError(f"import_module({name!r}): a trace chose code to run")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", spy)
    return calls


@pytest.fixture
def user_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``kvspec_replay_safety_target:make_target`` importable: the spec target, counting its calls
    (``_user_calls``); the module is forgotten afterwards."""
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / f"{USER_MODULE}.py").write_text(
        "from kvspec.harness.targets.spec import SpecTarget\n"
        "CALLS = {'n': 0}\n"
        "def make_target():\n"
        "    CALLS['n'] += 1\n"
        "    return SpecTarget()\n"
    )
    monkeypatch.syspath_prepend(str(folder))
    sys.modules.pop(USER_MODULE, None)
    yield
    sys.modules.pop(USER_MODULE, None)


def _user_calls() -> int:
    mod = sys.modules.get(USER_MODULE)
    return 0 if mod is None else int(mod.CALLS["n"])


# --- the target: never chosen by the file ------------------------------------------------------------


@pytest.mark.parametrize("target", ["sys:exit", "os:abort", f"{USER_MODULE}:make_target"])
def test_a_code_target_recorded_in_a_trace_is_refused(
    target: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    imports: list[str],
    user_target: None,
) -> None:
    path = _trace(tmp_path, target)
    assert main(["replay", str(path)]) == 2
    out, err = capsys.readouterr()
    assert str(path) in err and repr(target) in err, err
    assert "--target" in err and "--trust-trace-target" in err, err
    assert "Traceback" not in out + err and not out
    module = target.split(":")[0]
    assert module not in imports and _user_calls() == 0, imports


def test_report_runs_no_target_and_names_the_replay_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], imports: list[str]
) -> None:
    path = _trace(tmp_path, "os:abort")
    assert main(["report", str(path)]) == 0
    assert "`kvspec replay <this folder> --target os:abort`" in capsys.readouterr().out
    assert "os" not in imports
    assert main(["report", str(_trace(tmp_path, "spec"))]) == 0
    assert "`kvspec replay <this folder>`" in capsys.readouterr().out


def test_one_refused_trace_stops_the_replay_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], imports: list[str]
) -> None:
    good = _trace(tmp_path, "spec", "a.json")
    bad = _trace(tmp_path, "sys:exit", "b.json")
    assert main(["replay", str(good), str(bad)]) == 2
    out, err = capsys.readouterr()
    assert str(bad) in err and not out


def test_trust_trace_target_uses_the_recorded_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], user_target: None
) -> None:
    path = _trace(tmp_path, f"{USER_MODULE}:make_target")
    assert main(["replay", "--trust-trace-target", str(path)]) == 0, capsys.readouterr()
    assert _user_calls() >= 1


def test_target_on_the_command_line_overrides_the_recorded_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], imports: list[str], user_target: None
) -> None:
    for recorded in ("os:abort", f"{USER_MODULE}:make_target"):
        path = _trace(tmp_path, recorded)
        assert main(["replay", "--target", "spec", str(path)]) == 0, capsys.readouterr()
        assert recorded.split(":")[0] not in imports and _user_calls() == 0
    # And the user may name their own code there: the command line, not the file, chose it.
    path = _trace(tmp_path, "spec")
    assert main(["replay", "--target", f"{USER_MODULE}:make_target", str(path)]) == 0
    assert _user_calls() >= 1


@pytest.mark.parametrize(
    "recorded",
    [
        "spec",
        "impl",
        "mutant:swa_skip_n_minus_w",  # a spec mutant that a full-attention trace does not reach
        "mutant:window_off_by_one",  # an impl allocator mutant, likewise
    ],
)
def test_a_builtin_recorded_target_replays_without_flags(
    recorded: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], imports: list[str]
) -> None:
    path = _trace(tmp_path, recorded)
    assert main(["replay", str(path)]) == 0, capsys.readouterr()
    assert "1/1 trace(s) behaved as recorded" in capsys.readouterr().out


def test_a_recorded_mutant_is_the_one_that_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The corpus trace of a deliberate bug, recorded on that mutant, departs from its (spec) record."""
    path = _trace(tmp_path, "mutant:cache_drafts")
    assert main(["replay", str(path)]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_an_unknown_recorded_mutant_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _trace(tmp_path, "mutant:no_such_bug")
    assert main(["replay", str(path)]) == 2
    assert "unknown mutant 'no_such_bug'" in capsys.readouterr().err


def test_only_user_targets_name_code() -> None:
    """A recorded name runs code only if it is a user's ``package.module:factory``; any other name is
    looked up in the catalogue, and one it does not hold is refused without importing anything."""
    for name in ("spec", "impl", "vllm", "vllm-fixed", "vllm-scheduler", "mutant:cache_drafts", "mutant:x"):
        assert not is_user_target(name), name
    for name in ("sys:exit", "os:abort", "mypkg.adapter:make_target", "spec:x", "kvspec.harness.targets:x"):
        assert is_user_target(name), name
    for name in ("", "SPEC", "vllmish"):
        with pytest.raises(TargetLoadError, match="unknown target"):
            resolve(name)


# --- folders -------------------------------------------------------------------------------------------


def test_a_folder_skips_json_files_that_are_not_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _trace(tmp_path, "spec", "t.json")
    (tmp_path / "package.json").write_text('{"name": "x"}')
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "notes.json").write_text("not JSON at all")
    (tmp_path / "bytes.json").write_bytes(b"\xff\x00\x01")
    assert main(["replay", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "1/1 trace(s) behaved as recorded" in out
    for name in ("package.json", "list.json", "notes.json", "bytes.json"):
        assert f"skipped {tmp_path / name}" in err, err
    assert "Traceback" not in err


def test_hidden_folders_and_virtualenvs_are_not_walked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _trace(tmp_path, "spec", "corpus/t.json")
    for hidden in (".venv", ".git", ".hypothesis", "env", "corpus/.cache"):
        (tmp_path / hidden).mkdir(parents=True)
        (tmp_path / hidden / "bad.json").write_text('{"kvspec_trace": 1, "config": "damaged"}')
    (tmp_path / "env" / "pyvenv.cfg").write_text("home = /usr\n")
    assert main(["replay", str(tmp_path)]) == 0, capsys.readouterr()
    out, err = capsys.readouterr()
    assert "bad.json" not in out + err


def test_a_damaged_trace_in_a_folder_is_exit_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _trace(tmp_path, "spec", "a.json")
    d = json.loads(FULL.read_text())
    d["config"]["num_blocks"] = "many"
    (tmp_path / "b.json").write_text(json.dumps(d))
    (tmp_path / "c.json").write_text(FULL.read_text()[:300])  # truncated: still says "kvspec_trace"
    assert main(["replay", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'b.json'}: config.num_blocks: expected an int" in err
    (tmp_path / "b.json").unlink()
    assert main(["replay", str(tmp_path)]) == 2
    assert f"{tmp_path / 'c.json'}: not valid JSON (truncated?)" in capsys.readouterr().err


def test_a_folder_without_traces_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "package.json").write_text('{"name": "x"}')
    assert main(["replay", str(tmp_path)]) == 2
    assert "holds no kvspec traces (1 other .json file(s) skipped)" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["replay", str(empty)]) == 2
    assert "holds no kvspec traces" in capsys.readouterr().err


def test_a_file_named_on_the_command_line_must_be_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "package.json"
    path.write_text('{"name": "x"}')
    assert main(["replay", str(path)]) == 2
    assert f"{path}: not a kvspec trace" in capsys.readouterr().err


def test_an_empty_path_is_a_usage_error_not_this_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _trace(tmp_path, "spec", "t.json")  # replaying the current folder would pass
    monkeypatch.chdir(tmp_path)
    assert main(["replay", ""]) == 2
    assert "empty path" in capsys.readouterr().err
    assert main(["report", ""]) == 2
    assert "empty path" in capsys.readouterr().err


# --- exit codes -----------------------------------------------------------------------------------------


def test_an_operation_that_cannot_be_applied_departs_from_the_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a reference (relation "invariants") a step on an unknown request is exit 1, no traceback."""
    d = json.loads(FULL.read_text())
    d["relation"] = "invariants"
    d["steps"].insert(0, {"op": "append_output_tokens", "request_id": "ghost", "token_ids": [1], "outcome": None})
    path = tmp_path / "t.json"
    path.write_text(json.dumps(d))
    assert main(["replay", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "step 0 (append_output_tokens)" in out and "Traceback" not in out + err
    assert "the scheduler's request book rejected the operation" in out and "unknown request 'ghost'" in out


def test_a_bad_step_timeout_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--step-timeout", "nan", str(FULL)]) == 2
    assert "--step-timeout" in capsys.readouterr().err
