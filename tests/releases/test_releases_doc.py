"""docs/releases.md keeps up with spec/releases: a section per release, and each modelled change
named in its release's row of the table."""

from __future__ import annotations

import re
from pathlib import Path

from kvspec.spec.releases.line import CHANGES, RELEASES

DOC = Path(__file__).resolve().parents[2] / "docs" / "releases.md"


def _table_rows() -> dict[str, str]:
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"^\| (\d+\.\d+\.\d+) \| (.*?) \|", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def test_every_release_has_a_section_and_a_row() -> None:
    text = DOC.read_text()
    rows = _table_rows()
    for release in RELEASES:
        assert re.search(rf"^## {re.escape(release)}\b", text, re.M), release
        assert release in rows, release


def test_each_change_is_named_in_its_release_row() -> None:
    rows = _table_rows()
    missing = [f"{c.release}: {c.name}" for c in CHANGES if f"`{c.name}`" not in rows[c.release]]
    assert not missing, f"docs/releases.md's table lacks {missing}"
    named = {n for row in rows.values() for n in re.findall(r"`([a-z0-9_]+)`", row)}
    unknown = named - {c.name for c in CHANGES}
    assert not unknown, f"the table names changes spec/releases does not have: {unknown}"
