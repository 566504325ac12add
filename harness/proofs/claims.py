"""Every claim of ``kvspec prove``, in report order."""

from __future__ import annotations

from harness.proofs.core import Claim


def all_claims() -> list[Claim]:
    import harness.proofs.allocation as allocation
    import harness.proofs.coverage as coverage
    import harness.proofs.coverage_failures as coverage_failures
    import harness.proofs.hybrid as hybrid
    import harness.proofs.keys as keys
    import harness.proofs.pool as pool
    import harness.proofs.windows as windows

    return [
        *allocation.CLAIMS,
        *windows.CLAIMS,
        *coverage.CLAIMS,
        *coverage_failures.CLAIMS,
        *hybrid.CLAIMS,
        *pool.CLAIMS,
        *keys.CLAIMS,
    ]
