"""kvspec in a user's own repository, end to end: every command of docs/ci.md's and the README's
"In your own CI" ``bash`` blocks runs exactly as written in a throwaway repository of the documented
shape (``user_repo.py``), exits as its comment promises, and prints what a user needs to see (the
relation in force and why, the size of the run, the verdict).  The commands are read from the docs,
so docs and test cannot drift; a command with no check here fails the test."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import time
import xml.etree.ElementTree as ET

import pytest
from ci_helpers import REPO
from packaging.requirements import Requirement
from user_repo import Command, UserRepo, documented_commands, make_user_repo, redis_recipe

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs git and a git checkout of kvspec"
)
TARGET = "mypkg.kvspec_adapter:make_target"
DECLARED = f"relation invariants (declared by target {TARGET}: "


def _check_fuzz(r: subprocess.CompletedProcess[str]) -> None:
    first, second = r.stderr.splitlines()[:2]
    assert first.startswith(f"kvspec fuzz: target {TARGET}, families no_cache"), first
    assert second.startswith(f"kvspec fuzz: {DECLARED}") and second.endswith("the KV ledger is on"), second
    assert "kvspec fuzz: no finding" in r.stdout + r.stderr


def _check_pytest(r: subprocess.CompletedProcess[str]) -> None:
    assert f"kvspec: target {TARGET}, {DECLARED}" in r.stdout
    assert "kvspec: 1 test(s), one per family (no_cache); each up to 100 examples of 50 steps" in r.stdout
    # The user's own two tests, the docs' fixture snippet and TestKVSpec_no_cache.
    assert re.search(r"\b4 passed in\b", r.stdout), r.stdout[-3000:]


def _check_mutants(r: subprocess.CompletedProcess[str]) -> None:
    assert f"kvspec mutants: {DECLARED}" in r.stderr, r.stderr
    assert "kvspec mutants: 2/2 killed" in r.stdout, r.stdout


CHECKS = {"kvspec fuzz ": _check_fuzz, "pytest ": _check_pytest, "kvspec mutants ": _check_mutants}
INSTALL = "python -m pip install "


def _is_redis(c: Command) -> bool:
    """A line of the Redis recipe (not an install line naming the ``redis`` extra)."""
    return "redis" in c.line.lower() and not c.line.startswith(INSTALL)


def _run_until_progress(repo: UserRepo, line: str, limit: float = 60) -> str:
    """Start ``line`` (runs until stopped), wait for kvspec's progress line with examples counted,
    stop it with SIGINT as a user would; what it printed."""
    proc = subprocess.Popen(
        ["bash", "--noprofile", "--norc", "-c", line],
        cwd=repo.root,
        env=repo.env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert proc.stdout is not None
    seen: list[str] = []
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + limit
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if sel.select(timeout=1):
                seen.append(proc.stdout.readline())
                if re.match(r"kvspec: TestKVSpec_no_cache \(pid \d+\): [1-9]\d* examples", seen[-1]):
                    break
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have exited already: its output says why
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return "".join(seen) + proc.stdout.read()


def test_every_documented_command_has_a_check():
    commands = [c for c in documented_commands() if not _is_redis(c)]
    unchecked = [
        c.line
        for c in commands
        if not c.line.startswith(INSTALL) and c.status is not None and not any(c.line.startswith(p) for p in CHECKS)
    ]
    assert unchecked == [], "a documented command this test does not check"
    assert [c.line.split()[:2] for c in commands if c.status is None] == [["hypothesis", "fuzz"]]


def _check_extras(repo: UserRepo, install_lines: list[str]) -> None:
    """Each extra an install line names is declared by the installed kvspec, and the versions this
    environment holds (what pip, given an index, would have had to fetch) satisfy it."""
    named = {e for line in install_lines for m in re.finditer(r"kvspec\[([\w,]+)\]", line) for e in m[1].split(",")}
    assert named == {"pytest", "hypofuzz", "redis"}, named
    (metadata,) = repo.venv.glob("lib/python*/site-packages/kvspec-*.dist-info/METADATA")
    requires = [
        Requirement(line.split(":", 1)[1])
        for line in metadata.read_text().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    for extra in sorted(named):
        wanted = [r for r in requires if r.marker is not None and r.marker.evaluate({"extra": extra})]
        assert wanted, f"kvspec[{extra}] installs nothing"
        for r in wanted:
            assert r.specifier.contains(importlib.metadata.version(r.name), prereleases=True), (extra, str(r))


def test_a_users_repository_runs_every_documented_command(tmp_path):
    repo = make_user_repo(tmp_path)
    commands = [c for c in documented_commands() if not _is_redis(c)]
    for c in (c for c in commands if c.line.startswith(INSTALL)):
        r = repo.run(c.line)
        assert r.returncode == c.status, (c.line, r.stdout, r.stderr)
    # One import name: kvspec from the install, the user's harness and spec from the repository.
    code = "import harness, spec, kvspec.harness; print(kvspec.harness.__file__, harness.__file__, spec.__file__)"
    where = repo.run(f'python -c "{code}"')
    ours, theirs, their_spec = where.stdout.split()
    assert ours.startswith(str(repo.venv)), where.stdout + where.stderr  # the installed kvspec, not this checkout
    assert theirs == str(repo.root / "harness" / "__init__.py") and their_spec.startswith(str(repo.root / "spec"))
    top = repo.run(
        "python -c \"import importlib.metadata as m; print(m.distribution('kvspec').read_text('top_level.txt'))\""
    )
    assert top.stdout.split() == ["kvspec"], top.stdout + top.stderr  # nothing installed beside it
    _check_extras(repo, [c.line for c in commands if c.line.startswith(INSTALL)])
    failures = []
    for c in commands:
        if c.line.startswith(INSTALL):
            continue
        if c.status is None:
            out = _run_until_progress(repo, c.line)
            if not re.search(r"kvspec: TestKVSpec_no_cache \(pid \d+\): [1-9]\d* examples", out):
                failures.append((c.line, "no progress line", out[-3000:]))
            continue
        r = repo.run(c.line)
        try:
            assert r.returncode == c.status, f"exit {r.returncode}, documented {c.status}"
            next(check for prefix, check in CHECKS.items() if c.line.startswith(prefix))(r)
        except AssertionError as e:
            failures.append((c.line, str(e), (r.stdout + r.stderr)[-3000:]))
    assert failures == []


needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server (docs/ci.md)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@needs_redis
def test_the_redis_recipe_runs_as_documented(tmp_path):
    """The Redis block of docs/ci.md, in order, in one shell: a server on loopback, two workers on it,
    the server stopped."""
    repo = make_user_repo(tmp_path)
    block = [c for c in documented_commands() if _is_redis(c)]
    install = [c.line for c in documented_commands() if c.line.startswith(INSTALL)]
    port = free_port()
    start, url, stop = redis_recipe()
    assert [c.line for c in block] == [start, url, block[2].line, stop] and all(c.status == 0 for c in block)
    try:
        r = repo.run("\n".join([*install, *(c.line for c in block)]), timeout=180, REDIS_PORT=str(port))
    finally:
        if (repo.root / "redis.pid").exists():
            subprocess.run(["bash", "-c", stop], cwd=repo.root, capture_output=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "families no_cache, up to 5s, seed 0, 2 workers" in r.stderr, r.stderr
    assert "kvspec fuzz: no finding" in r.stdout + r.stderr
    (suite,) = ET.parse(repo.root / "fuzz.xml").getroot()
    assert [c.get("name") for c in suite.iter("testcase")] == ["no_cache"] and not list(suite.iter("failure"))
    time.sleep(0.5)
    with socket.socket() as s:  # stopped: nothing listens on the port any more
        assert s.connect_ex(("127.0.0.1", port)) != 0
