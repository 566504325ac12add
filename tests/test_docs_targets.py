"""docs/targets.md works as written: every ``kvspec`` command of its fenced code blocks, run from the
repository root with the console script and with ``python -m kvspec.harness`` (no ``PYTHONPATH``), exits as
its ``# exits N`` comment says; and a ``package.module:factory`` target loads from the current folder
even when nothing else put that folder on ``sys.path`` (a console script does not)."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.harness.check.finding import FindingError
from kvspec.harness.check.lockstep import Lockstep
from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.core import ops as O
from kvspec.harness.run.catalogue import resolve
from kvspec.harness.targets import TargetLoadError, Unsupported
from kvspec.spec.config import KVCacheConfig, full_attention
from kvspec.spec.types import BlockCount, TokenCount

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "targets.md"
REPORTS = ROOT / "kvspec-reports"
LAUNCHERS = {
    "console-script": [str(Path(sys.executable).with_name("kvspec"))],
    "python-m": [sys.executable, "-m", "kvspec.harness"],
}


def doc_commands() -> list[tuple[str, int | None]]:
    """Each ``kvspec`` line of the doc's fenced blocks (``VAR=value`` prefixes allowed), with the
    exit status its ``# exits N`` comment promises (None when it has none)."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", DOC.read_text(), re.M | re.S)
    commands: list[tuple[str, int | None]] = []
    for line in (line for block in blocks for line in block.splitlines()):
        command, _, comment = line.partition("  # ")
        if re.match(r"(\w+=\S* )*kvspec ", command):
            status = re.match(r"exits (\d+)", comment)
            commands.append((command.strip(), int(status.group(1)) if status else None))
    return commands


def test_the_doc_has_commands_and_each_says_its_exit_status() -> None:
    commands = doc_commands()
    assert len(commands) >= 3
    assert [c for c, status in commands if status is None] == []


def _run(command: str, launcher: list[str]) -> subprocess.CompletedProcess[str]:
    words = shlex.split(command)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words[0] == "kvspec"
    return subprocess.run(
        [*launcher, *words[1:]], cwd=ROOT, env=env, text=True, capture_output=True, timeout=300, check=False
    )


def _remove_reports(output: str, had_reports: bool) -> None:
    """The report folders a command wrote under the repository's ``kvspec-reports/``, removed."""
    for folder in re.findall(r"report written to (\S+)", output):
        path = (ROOT / folder).resolve()
        if path.parent == REPORTS.resolve():
            shutil.rmtree(path, ignore_errors=True)
    if not had_reports and REPORTS.is_dir() and not any(REPORTS.iterdir()):
        REPORTS.rmdir()


@pytest.mark.parametrize(
    "launcher", ["console-script", pytest.param("python-m", marks=pytest.mark.full)]
)  # python -m in the full tier: the same commands, about 12 s more
@pytest.mark.parametrize("command, status", doc_commands(), ids=[c for c, _ in doc_commands()])
def test_a_documented_command_exits_as_documented(command: str, status: int | None, launcher: str) -> None:
    had_reports = REPORTS.exists()
    r = _run(command, LAUNCHERS[launcher])
    _remove_reports(r.stdout + r.stderr, had_reports)
    assert r.returncode == status, f"{command}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr


def test_a_user_target_loads_from_the_current_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``kvspec`` (a console script) runs with its own folder, not the current one, on ``sys.path``;
    the ``package.module:factory`` loader puts the current folder there, as ``python -m`` does."""
    (tmp_path / "kvspec_cwd_target.py").write_text("from kvspec.harness.targets.spec import SpecTarget as make\n")
    monkeypatch.chdir(tmp_path)
    cwd = os.getcwd()
    monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.abspath(p) != cwd])
    monkeypatch.delitem(sys.modules, "kvspec_cwd_target", raising=False)
    try:
        factory = resolve("kvspec_cwd_target:make").factory
    except TargetLoadError as e:
        pytest.fail(f"the current folder's module did not load: {e}")
    assert factory().name == "spec"


# --- the worked example keeps the doc's promises ------------------------------------------------------

NO_CACHE = KVCacheConfig(BlockCount(8), (full_attention(4),), TokenCount(32), enable_caching=False)
ONE_REQUEST: list[O.Op] = [
    O.AddRequest("r1", tuple(range(1, 9))),
    O.GetComputedBlocks("r1"),
    O.AllocateSlots("r1", 8, use_computed_blocks=True),
    O.SetNumComputedTokens("r1", 8),
    O.Free("r1"),
]


def _example_run(config: KVCacheConfig, relation: str) -> None:
    from examples.my_manager import make_target

    ls = Lockstep(config, make_target(), CheckSettings(relation=relation, step_timeout=None))
    ls.start()
    for op in ONE_REQUEST:
        ls.apply(op)


def test_the_example_keeps_the_invariants_and_declines_prefix_caching() -> None:
    """With caching on, ``observe()`` would owe the requests' block hashes (§9.12): the example, which
    has no prefix cache, declines those configs instead of breaking ``hash_chain``."""
    _example_run(NO_CACHE, "invariants")
    with pytest.raises(Unsupported, match="no prefix cache"):
        _example_run(dataclasses.replace(NO_CACHE, enable_caching=True), "invariants")


def test_the_example_differs_from_vllm_where_the_doc_says() -> None:
    """Under ``exact`` the first difference is the free-queue order after a free, not the hashes."""
    with pytest.raises(FindingError) as e:
        _example_run(NO_CACHE, "exact")
    f = e.value.finding
    assert (f.kind, (f.op or {}).get("op")) == ("divergence", "free"), f.summary()
    assert "free queue differs" in f.message
