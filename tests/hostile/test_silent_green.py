"""No silent green: a run that checked nothing says why and exits 4, never 0.

- a target that refuses every family (here: one whose every reset is ``Unsupported``) exits 4 and
  names each family with the target's reason;
- vLLM behind wrappers that show only ``*args, **kwargs`` (tests/hostile/kvspec_wrapped.py) is still
  driven: the release probe sees through a wrapper that closes over the original, and takes an opaque
  one to accept every keyword, saying so on stderr (the deliberate bug: a probe that reads the
  wrapper's signature refuses every family, and the run exits 4 instead of checking).
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.harness.run.exits import EXIT_UNCHECKED
from kvspec.harness.targets.vllm_release import _accepted, _params

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

REFUSING = """
from kvspec.harness.targets.base import Unsupported
from kvspec.harness.targets.spec import SpecTarget


class Refusing(SpecTarget):
    def reset(self, config):
        raise Unsupported("this manager models no config at all")
"""


def kvspec(*argv: str, env: dict[str, str] | None = None, path: str = "") -> subprocess.CompletedProcess[str]:
    pythonpath = os.pathsep.join(p for p in (path, str(HERE), str(ROOT)) if p)
    e = {**os.environ, "PYTHONPATH": pythonpath, **(env or {})}
    cmd = [sys.executable, "-m", "kvspec.harness", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=e, cwd=ROOT, timeout=300, check=False)


def test_a_run_whose_every_family_is_refused_exits_4_and_says_why(tmp_path: Path) -> None:
    (tmp_path / "kvspec_refusing.py").write_text(REFUSING)
    argv = ["fuzz", "--target", "kvspec_refusing:Refusing", "--family", "full,events", "--seconds", "20"]
    run = kvspec(*argv, "--out", str(tmp_path / "out"), path=str(tmp_path))
    assert run.returncode == EXIT_UNCHECKED == 4, run.stdout + run.stderr
    assert "CHECKED NOTHING" in run.stdout and "this manager models no config at all" in run.stdout
    assert "full:" in run.stdout and "events:" in run.stdout


def _takes(a, b=1, *, c=None):  # the original a wrapper hides
    return a


def _closing(fn):  # a hand-written wrapper (no functools.wraps) that keeps the name
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    wrapper.__name__ = fn.__name__
    return wrapper


def test_the_probe_sees_through_wrappers() -> None:
    closing = _closing(_takes)

    def opaque(*args, **kwargs):
        return {"f": _takes}["f"](*args, **kwargs)

    assert _params(_takes) == {"a", "b", "c"}
    assert inspect.signature(closing).parameters.keys() == {"args", "kwargs"}
    assert _params(closing) == {"a", "b", "c"}
    assert _params(opaque) is None  # nothing to see: every keyword is passed
    assert _accepted("f", None, {"anything": 1}, {}, "x") == {"anything": 1}


@pytest.mark.vllm
@pytest.mark.parametrize("wrap", ["opaque", pytest.param("closing", marks=pytest.mark.full)])
def test_vllm_behind_wrappers_is_checked(tmp_path: Path, wrap: str) -> None:
    argv = ["fuzz", "--target", "kvspec_wrapped:factory", "--relation", "exact", "--family", "full"]
    run = kvspec(*argv, "--seconds", "3", "--out", str(tmp_path / "out"), env={"KVSPEC_WRAP": wrap})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "no finding" in run.stdout and " 0 steps" not in run.stdout
    if wrap == "opaque":
        assert "shows only *args/**kwargs" in run.stderr
