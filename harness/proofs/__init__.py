"""Z3 proofs of the spec's arithmetic, key construction, hit searches and pool (``kvspec prove``).

Each claim is a ``harness.proofs.core.Claim``: a name, a statement, its premises, and a check that
calls the spec's own code.  ``all_claims()`` (``claims``) lists them in report order; ``prove_main`` is the
command line.

Imports: harness.core, harness.targets, harness.traces, spec.
"""

from __future__ import annotations

from kvspec.harness.proofs.claims import all_claims
from kvspec.harness.proofs.core import COUNTEREXAMPLE, PROVEN, REFUTED, UNKNOWN, Claim, Outcome, Result, run_claim


def prove_main(argv: list[str]) -> int:
    from kvspec.harness.proofs.cli import prove_main as main

    return main(argv)


__all__ = [
    "COUNTEREXAMPLE",
    "PROVEN",
    "REFUTED",
    "UNKNOWN",
    "Claim",
    "Outcome",
    "Result",
    "all_claims",
    "prove_main",
    "run_claim",
]
