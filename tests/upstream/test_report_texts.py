"""The upstream reports in docs/upstream/ read as a maintainer wants them.

Each report opens with the text meant for the upstream tracker, ended by ``MARKER``; below it
is the project's own evidence (per-release runs, measured impact, proofs), which stays here.
The upstream text must be short, have the four sections a maintainer looks for, and name none
of this project's internals: no finding ids (``K1``, ``S1``), no project name, no paths into
this repository (vLLM's own ``tests/v1/`` paths are vLLM's) but the attached reproduction's file
names.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "upstream"
MARKER = "<!-- upstream text ends here; below: this project's evidence -->"
SECTIONS = ("## What happens", "## Reproduction", "## Affected releases", "## Proposed fix")
MAX_LINES = 120
INTERNAL = {
    "a finding id": re.compile(r"\b[KS]\d{1,2}\b"),
    "the project's name": re.compile(r"kvspec", re.IGNORECASE),
    "a path into this repository": re.compile(r"\b(?:tests/(?!v1/)|harness/|spec/|impl/|docs/|ci/)[\w./-]+"),
    "a local environment": re.compile(r"\.venv|KVSPEC_"),
    "a section of the project's notes": re.compile(r"§\s?\d"),
}


def upstream_text(text: str) -> str | None:
    head, sep, _ = text.partition(MARKER)
    return head if sep else None


def problems(text: str) -> list[str]:
    """What keeps ``text`` (a whole report file) from being sent as it is."""
    head = upstream_text(text)
    if head is None:
        return [f"no end marker {MARKER!r}"]
    found = []
    lines = head.rstrip("\n").splitlines()
    if len(lines) > MAX_LINES:
        found.append(f"the upstream text has {len(lines)} lines (at most {MAX_LINES})")
    found += [f"no {s!r} section" for s in SECTIONS if not any(line.startswith(s) for line in lines)]
    for what, pattern in INTERNAL.items():
        for n, line in enumerate(lines, 1):
            m = pattern.search(line)
            if m:
                found.append(f"line {n} names {what}: {m.group(0)!r}")
    return found


REPORTS = sorted(DOCS.glob("*.md"))


def test_there_are_reports():
    assert len(REPORTS) >= 8


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: p.stem)
def test_upstream_text_is_short_complete_and_free_of_internals(path):
    assert problems(path.read_text()) == []


GOOD = "# Title\n\n" + "\n\ntext\n\n".join(SECTIONS) + "\n\n" + MARKER + "\n\nK1 kvspec tests/upstream/x.py\n"


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda t: t.replace("## Proposed fix", "## Fix"), "no '## Proposed fix' section"),
        (lambda t: t.replace("# Title", "# Title (K3)"), "names a finding id: 'K3'"),
        (lambda t: t.replace("# Title", "# Found by kvspec"), "names the project's name"),
        (lambda t: t.replace("# Title", "# see tests/upstream/test_x.py"), "names a path into this repository"),
        (lambda t: t.replace("# Title", "# run .venv/bin/python"), "names a local environment"),
        (lambda t: t.replace(MARKER, ""), "no end marker"),
        (lambda t: t.replace("# Title", "# Title" + "\nline" * MAX_LINES), "lines (at most"),
    ],
)
def test_the_check_fails_each_deliberate_slip(edit, expected):
    """The check can fail: the clean sample passes, each slip is named; the evidence below the
    marker may say anything."""
    assert problems(GOOD) == []
    found = problems(edit(GOOD))
    assert any(expected in p for p in found), found
