"""A user's own repository, as docs/ci.md describes it, made in a temp folder for the tests of
``test_ci_user_repo.py``: its documented commands, read from the docs, and the repository they run in.

The repository: ``git init``, a package ``mypkg`` whose ``kvspec_adapter.py`` is a copy of
``examples/my_manager.py`` and whose ``kvspec_mutants.py`` is ``examples/my_manager_mutants.py``
(importing the copy), the user's own ``tests/`` (a test of the manager, and the docs' ``kvspec``
fixture snippet), and a ``pyproject.toml``.  Its virtualenv starts without kvspec: it sees this
environment's packages through a ``.pth`` (pip, torch, Hypothesis, pytest: what ``pip install``
would have fetched) but not kvspec's editable install (a ``.pth`` file's own ``.pth`` files are not
read), and kvspec gets into it only by the documented install lines, run as written with pip pointed
by its environment at a local git repository holding this working tree as one commit (``snapshot``)
and at no index."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from ci_helpers import REPO

DOCS = (REPO / "docs" / "ci.md", REPO / "README.md")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


@dataclass(frozen=True)
class Command:
    line: str  # as written in the docs
    status: int | None  # what its "# exits N" comment promises; None: "# runs until stopped"


def _user_ci_text(path: Path) -> str:
    """The part of ``path`` about a user's CI: all of docs/ci.md, the README's "In your own CI"."""
    text = path.read_text()
    if path.name == "README.md":
        start = text.index("## In your own CI")
        text = text[start : text.index("\n## ", start + 1)]
    return text


def documented_commands() -> list[Command]:
    """Each line of a ``bash`` block of the docs, once, in order, with its promise."""
    out: dict[str, Command] = {}
    for path in DOCS:
        for lang, body in FENCE.findall(_user_ci_text(path)):
            if lang != "bash":
                continue
            for raw in body.splitlines():
                line, _, comment = raw.partition("  # ")
                status = re.match(r"exits (\d+)", comment)
                if not line.strip():
                    continue
                if status is None and comment != "runs until stopped":
                    raise AssertionError(f"{path.name}: {raw!r} says neither '# exits N' nor '# runs until stopped'")
                out.setdefault(line.strip(), Command(line.strip(), int(status.group(1)) if status else None))
    return list(out.values())


def fixture_snippet() -> str:
    """The ``python`` block of docs/ci.md: the ``kvspec`` fixture in a test of the user's own."""
    (snippet,) = [body for lang, body in FENCE.findall(DOCS[0].read_text()) if lang == "python"]
    return snippet


OWN_TEST = """
from harness.tools import answer
from mypkg.kvspec_adapter import TinyManager
from spec.model import NAME


def test_the_manager_hands_out_whole_blocks():
    m = TinyManager(num_blocks=4, block_size=4, max_model_len=16)
    assert m.allocate("r", 5) == [1, 2] and m.allocate("s", 9) is None


def test_the_users_own_harness_and_spec():
    assert answer() == 42 and NAME == "the user's own spec"
"""
"""The user's own tests: of its manager, and of its own top-level ``harness`` and ``spec`` packages,
which kvspec (imported only as ``kvspec``) must neither shadow nor be shadowed by."""


OWN_SPEC = 'NAME = "the user\'s own spec"\n'


@dataclass(frozen=True)
class UserRepo:
    root: Path  # the repository, where the commands run
    venv: Path
    env: dict[str, str]

    def run(self, line: str, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", line],
            cwd=self.root,
            env={**self.env, **extra},
            text=True,
            capture_output=True,
            timeout=timeout,
        )


def snapshot(clone: Path) -> str:
    """A git repository at ``clone`` whose HEAD commit is this working tree as it is (tracked files
    and new ones git does not ignore, so uncommitted work is what gets installed); its commit id."""
    git = ["git", "-c", "user.name=kvspec-test", "-c", "user.email=test@invalid"]
    subprocess.run([*git, "clone", "-q", str(REPO), str(clone)], check=True)
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "-c", "-o", "--exclude-standard"], check=True, capture_output=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        src, dst = REPO / name, clone / name
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
        elif dst.is_file():  # deleted in the working tree
            dst.unlink()
    subprocess.run([*git, "-C", str(clone), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(clone), "commit", "-q", "--allow-empty", "-m", "working tree"], check=True)
    return subprocess.run(
        ["git", "-C", str(clone), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


def make_user_repo(tmp: Path) -> UserRepo:
    """The repository and its virtualenv (kvspec not yet installed), in ``tmp``."""
    root = tmp / "userrepo"
    pkg = root / "mypkg"
    (root / "tests").mkdir(parents=True)
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""The user\'s package."""\n')
    shutil.copy(REPO / "examples" / "my_manager.py", pkg / "kvspec_adapter.py")
    mutants = (REPO / "examples" / "my_manager_mutants.py").read_text()
    (pkg / "kvspec_mutants.py").write_text(mutants.replace("examples.my_manager", "mypkg.kvspec_adapter"))
    for own, module, text in (("harness", "tools", "def answer():\n    return 42\n"), ("spec", "model", OWN_SPEC)):
        (root / own).mkdir()
        (root / own / "__init__.py").write_text(f'"""The user\'s own {own} package."""\n')
        (root / own / f"{module}.py").write_text(text)
    (root / "tests" / "test_manager.py").write_text(OWN_TEST)
    (root / "tests" / "test_kvspec.py").write_text(fixture_snippet())
    (root / "pyproject.toml").write_text(
        '[project]\nname = "mypkg"\nversion = "0.1"\n\n[tool.pytest.ini_options]\npythonpath = ["."]\n'
    )
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "parent-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    for script in ("pytest", "hypothesis"):  # the console scripts `pip install pytest hypofuzz` would write
        parent = Path(sys.executable).with_name(script)
        if parent.is_file():
            text = parent.read_text().split("\n", 1)[1]
            (venv / "bin" / script).write_text(f"#!{venv / 'bin' / 'python'}\n{text}")
            (venv / "bin" / script).chmod(0o755)
    clone = tmp / "kvspec-git"
    head = snapshot(clone)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVSPEC_", "PYTHON", "PIP_", "VIRTUAL_ENV"))}
    parent_bin = str(Path(sys.executable).parent)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != parent_bin]
    env.update(
        PATH=os.pathsep.join([str(venv / "bin"), *path]),
        VIRTUAL_ENV=str(venv),
        KVSPEC_GIT=f"file://localhost{clone}",  # file://localhost/...: pip's URL check wants a host
        KVSPEC_REF=head,
        PIP_NO_INDEX="1",
        PIP_NO_DEPS="1",
        PIP_NO_BUILD_ISOLATION="0",  # pip's spelling of "no build isolation": setuptools from this environment
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    return UserRepo(root, venv, env)


def redis_recipe() -> tuple[str, str, str]:
    """docs/ci.md's Redis recipe: the line that starts a server, the one that names its URL, the one
    that stops it."""
    lines = [c.line for c in documented_commands()]
    start = next(line for line in lines if line.startswith("redis-server "))
    url = next(line for line in lines if line.startswith("export KVSPEC_REDIS_URL="))
    stop = next(line for line in lines if line.startswith("kill ") and "redis.pid" in line)
    return start, url, stop
