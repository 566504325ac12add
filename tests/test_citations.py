"""Every ``§N`` / ``§N.M`` citation in the code resolves to an anchor of docs/semantics.md, and no
source file points at material outside the repository.

A citation ``§9.3`` resolves when docs/semantics.md has the anchor ``s9-3`` (an HTML
``<a id="s9-3"></a>`` or a Markdown ``{#s9-3}``), and that anchor's heading carries the same
number.  A range such as ``§5-§8`` cites both ends.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SEMANTICS = ROOT / "docs" / "semantics.md"
FOLDERS = ("spec", "impl", "harness", "tests", "examples")
SKIPPED_PARTS = {".venv", "__pycache__", ".git"}

CITATION = re.compile(r"§ ?(\d+(?:\.\d+)*)")
ANCHOR = re.compile(r'<a id="([^"]+)"></a>|\{#([^}]+)\}')
# Spelled in two pieces so that this file does not mention them itself.
# The reference notes outside the repo, by file name, are forbidden too: cite docs/semantics.md.
FORBIDDEN = (
    "/work/" + "shared",
    "seed " + "article",
    "vllm-kv-" + "semantics.md",
    "bugs-tests-" + "and-invariants.md",
    "vllm-on-" + "cpu.md",
    "reference " + "§",
)


def get_anchor(number: str) -> str:
    """``9.3`` -> ``s9-3``: the anchor a citation ``§9.3`` must find."""
    return "s" + number.replace(".", "-")


def get_anchors(text: str) -> set[str]:
    return {a or b for a, b in ANCHOR.findall(text)}


def get_python_files(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if not SKIPPED_PARTS.intersection(p.relative_to(ROOT).parts))


def find_unresolved(name: str, text: str, anchors: set[str]) -> list[str]:
    """``name:line: §N.M`` for each citation in ``text`` without an anchor."""
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        for number in CITATION.findall(line):
            if get_anchor(number) not in anchors:
                out.append(f"{name}:{lineno}: §{number}")
    return out


def find_unresolved_in_file(path: Path, anchors: set[str]) -> list[str]:
    return find_unresolved(str(path.relative_to(ROOT)), path.read_text(encoding="utf-8"), anchors)


def find_forbidden(path: Path) -> list[str]:
    out = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        for phrase in FORBIDDEN:
            if phrase in line.lower():
                out.append(f"{path.relative_to(ROOT)}:{lineno}: {phrase!r}")
    return out


@pytest.fixture(scope="module")
def anchors() -> set[str]:
    return get_anchors(SEMANTICS.read_text(encoding="utf-8"))


def test_section_anchors_match_their_headings() -> None:
    """Each ``sN-M`` anchor sits right above a heading that starts with ``§N.M``."""
    lines = SEMANTICS.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        m = re.fullmatch(r'<a id="s(\d+(?:-\d+)*)"></a>', line)
        if m:
            number = m.group(1).replace("-", ".")
            assert i + 1 < len(lines) and re.match(rf"#+ §{re.escape(number)} ", lines[i + 1]), (
                f"docs/semantics.md:{i + 1}: anchor s{m.group(1)} is not followed by a '§{number}' heading"
            )


def test_the_checker_catches_an_unresolved_citation(anchors: set[str]) -> None:
    bogus = "§" + "9.3.1"  # in two pieces, or this very file would cite it
    text = f'"""See docs/semantics.md §9.3, § 10.8 and {bogus}."""\n'
    assert find_unresolved("probe.py", text, anchors) == [f"probe.py:1: {bogus}"]


@pytest.mark.parametrize("folder", FOLDERS)
def test_citations_resolve(folder: str, anchors: set[str]) -> None:
    unresolved = [u for p in get_python_files(folder) for u in find_unresolved_in_file(p, anchors)]
    assert not unresolved, "citations without an anchor in docs/semantics.md:\n" + "\n".join(unresolved)


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_reference_outside_the_repo(folder: str) -> None:
    found = [f for p in get_python_files(folder) for f in find_forbidden(p)]
    assert not found, "mentions of material outside the repository:\n" + "\n".join(found)
