"""docs/invariants.md is the registry as a table and cannot go stale.

Regenerate with ``python -m kvspec.spec.invariants`` from the repository root.
"""

import re
from pathlib import Path

from kvspec.spec.invariants import SPEC_INVARIANTS, render_invariant_table
from kvspec.spec.invariants.table import INVARIANT_TABLE_PATH, get_rule_anchor, get_rule_citations

ROOT = Path(__file__).resolve().parents[2]


def test_invariants_md_is_generated_from_the_registry():
    text = (ROOT / INVARIANT_TABLE_PATH).read_text(encoding="utf-8")
    assert text == render_invariant_table(), "docs/invariants.md is stale: run python -m kvspec.spec.invariants"


def test_table_has_one_row_per_invariant_in_registry_order():
    rows = [line for line in render_invariant_table().splitlines() if re.match(r"\| \d+ \|", line)]
    names = [re.search(r"`([^`]+)`", row).group(1) for row in rows]
    assert names == list(SPEC_INVARIANTS)


def test_every_cited_rule_has_an_anchor_in_semantics_md():
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', (ROOT / "docs" / "semantics.md").read_text(encoding="utf-8")))
    missing = {
        (inv.name, c)
        for inv in SPEC_INVARIANTS.values()
        for c in get_rule_citations(inv)
        if get_rule_anchor(c) not in anchors
    }
    assert not missing
