"""``python -m kvspec.spec.invariants [--check]``: write (or only compare) docs/invariants.md.

Run from the repository root.  ``--check`` exits 1 when the file differs from the registry.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kvspec.spec.invariants.table import INVARIANT_TABLE_PATH, render_invariant_table


def main(argv: list[str]) -> int:
    path = Path(INVARIANT_TABLE_PATH)
    text = render_invariant_table()
    if "--check" in argv:
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            print(f"{path} is stale: run python -m kvspec.spec.invariants", file=sys.stderr)
            return 1
        return 0
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
